"""Launchers of the GGUF block kernels (`triton/gguf_gemm.py`): `linear` and `fused_moe` on raw
block rows uint8 (N, K / block_size * type_size). Called through `GGUFFormat.triton_*` on
CUDA tensors (and by the tests on CPU tensors under TRITON_INTERPRET=1). No host sync: safe
in CUDA graphs. Which tile and path a call takes (the tile tables, the word paths' switches
Q4K_WORDS / Q6K_WORDS / Q80_WORDS and whether a weight allows them) is `gguf_tiles`'s; the
int8-activation switches Q8X_MOE / Q8X_LINEAR, read by the launchers, are here.

Prefill-sized calls (from `quant_launch.PREFILL_MIN_ROWS` rows, as the other quantized
formats, and PREFILL_MIN_PAIRS expert pairs) dequantize the weights they use to the
activation dtype (`triton/gguf_dequant_kernel.py`) and run the bf16 kernels: cuBLAS for
linears, `moe_launch`'s grouped GEMMs for experts through `quant_prefill.fused_moe_with`
(which numbers the ids a call uses, so an offload slot view costs no more than the layer).
The in-register grouped GEMMs decode every weight once per tile of rows: a 2048-token chunk
of Qwen3-30B-A3B's experts in Q4_K took 2.8 ms (H200, 2026-12-04) against 0.7 ms for the
bf16 grouped GEMMs; the dequantized path decodes each weight once and adds ~2.4 GB of bf16
writes and reads a layer for a call that touches all 128 experts (~0.8 ms at ~3 TB/s). Below
~64 rows an expert both decode each weight once, the in-register kernels more slowly (that
run: ~0.4 T weights/s against the GEMV decoder's ~1.1 T) but without the copies; the expert
threshold sits at 4,096 pairs (512 tokens at top-8), where the two are estimated about even:
decode batches of up to 511 sequences and short prompts keep the in-register kernels.
Placed by arithmetic, not measured: bench/NOTES.md.

Determinism: a linear's path and tiles (`gguf_tiles`) depend only on its M bucket (<=
DECODE_M, below or from PREFILL_MIN_ROWS), dtype, block type and N (the head tile); an expert
call's on its pair count (GEMV up to MAX_GEMV_PAIRS, in-register grouped, dequantized from
PREFILL_MIN_PAIRS), dtype and block type — never on ids. So a decode row's bits do not
depend on the batch within a bucket, and an expert's bits do not depend on which slot holds
it. (Linears switch to the dequantized route from 128 rows in decode too, e.g. a decode
graph of 128+ sequences; experts keep the in-register kernels up to 4,095 pairs.)"""

from __future__ import annotations

import torch
import triton

from xinfer import kernels
from xinfer.kernels import (
    gemv_launch,
    gguf_tiles,
    moe_align,
    moe_launch,
    pdl,
    quant_launch,
    quant_prefill,
)
from xinfer.kernels import gguf_q8x_launch as q8x
from xinfer.kernels.triton import gguf_dequant_kernel as deq_jit
from xinfer.kernels.triton import gguf_gemm as jit
from xinfer.quant.gguf_blocks import BlockType

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DEQUANT_BLOCK_N, DEQUANT_SUBS = 32, 8  # dequant tiles: elementwise, the bits do not depend on them
PREFILL_MIN_PAIRS = 4096  # expert calls from this many (token, k) pairs dequantize (above)
# decode GEMVs of Q4_K, Q8_0 and Q6_K weights on int8 activations (`gguf_q8x_launch`: dp4a,
# 2-4x fewer instructions a weight by the sm_90 SASS), experts and linears; chosen by shapes
# and types only, like the tiles; off until the H200 has timed them (bench/NOTES.md)
Q8X_MOE = False
Q8X_LINEAR = False


def word_aligned(x2: torch.Tensor) -> torch.Tensor:
    """x2 (M, K), or an aligned copy of it (the same values): the word path reads 16- and
    32-bit activations as 32-bit words, so its rows must start on 4-byte boundaries."""
    misaligned = x2.data_ptr() % 4 or (x2.shape[0] > 1 and x2.stride(0) * x2.element_size() % 4)
    return x2.clone(memory_format=torch.contiguous_format) if misaligned else x2


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def check_raw(w: torch.Tensor, btype: BlockType, rows: int, k: int, what: str) -> None:
    if w.dtype != torch.uint8 or w.shape[-2:] != (rows, btype.row_bytes(k)):
        raise ValueError(
            f"{what}: expected {btype.name} rows uint8 (..., {rows}, {btype.row_bytes(k)}), "
            f"got {w.dtype} {tuple(w.shape)}"
        )
    if w.stride(-1) != 1:
        raise ValueError(f"{what}: block rows must be contiguous in their last dim")


def dequantize(
    w: torch.Tensor,
    btype: BlockType,
    k: int,
    out: torch.Tensor,
    first: int = 0,
    ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Experts first .. first + len(out) of the block rows `w` (E, N, row bytes) → `out`
    (count, N, K), contiguous rows, in its dtype (the twin's float32 weights rounded once);
    given `ids` (int32, contiguous), experts ids[first + j] → out[j] instead, a negative id
    skipped (its rows of `out` left as they are)."""
    count, n = out.shape[0], out.shape[1]
    if count == 0 or n == 0 or k == 0:
        return out
    grid = (triton.cdiv(n, DEQUANT_BLOCK_N), triton.cdiv(k, DEQUANT_SUBS * 32), count)
    deq_jit.gguf_dequant_kernel[grid](
        w, ids if ids is not None else w, out,
        first, n, k,
        w.stride(0), w.stride(1), out.stride(0), out.stride(1),
        BTYPE=btype.type_id, GATHER=ids is not None, BLOCK_N=DEQUANT_BLOCK_N,
        SUBS=DEQUANT_SUBS, num_warps=4, enable_fp_fusion=False,  # the twin's roundings
    )  # fmt: skip
    return out


def dequantize_weight(w: torch.Tensor, btype: BlockType, k: int, dtype: torch.dtype):
    """One weight's block rows (N, row bytes) → its dense (N, K) copy in `dtype`."""
    out = torch.empty(1, w.shape[0], k, dtype=dtype, device=w.device)
    return dequantize(w.unsqueeze(0), btype, k, out)[0]


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    btype: BlockType,
    bias: torch.Tensor | None,
    n: int,
    k: int,
    tiles: gguf_tiles.GGUFTiles | None = None,
    dequant: bool | None = None,
) -> torch.Tensor:
    """x (..., K) @ W^T (+ bias) in x's dtype; W (N, K) stored as `btype` blocks (N, row bytes).
    `dequant`: whether to dequantize W and run `kernels.linear` (default: from
    PREFILL_MIN_ROWS rows); `tiles`: the in-register kernel's."""
    check_raw(w, btype, n, k, "gguf linear")
    if x.dtype not in _DTYPES or x.shape[-1] != k:
        raise ValueError(f"gguf linear: x {x.dtype} {tuple(x.shape)} for K={k}")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, decode_m = x2.shape[0], gguf_tiles.DECODE_M
    if m >= quant_launch.PREFILL_MIN_ROWS if dequant is None else dequant:
        return _dequantized_linear(x2, w, btype, bias, n, k).view(*x.shape[:-1], n)
    if Q8X_LINEAR and tiles is None and m <= decode_m and q8x.supports_linear(btype, w, k):
        return q8x.linear(x2, w, btype, bias, n).view(*x.shape[:-1], n)
    out = x.new_empty(m, n)
    if m == 0:
        return out.view(*x.shape[:-1], n)
    byte = lambda: gguf_tiles.linear_tiles(m, x.dtype, btype, n, words=False)  # noqa: E731
    t = gguf_tiles.path_tiles(tiles or gguf_tiles.linear_tiles(m, x.dtype, btype, n), w, btype,
                               k, byte)  # fmt: skip
    if t.block_m in (1, 4):
        if m > decode_m:
            raise ValueError(f"gguf linear: the GEMV tiles take at most {decode_m} rows")
        _gemv_linear(word_aligned(x2) if t.words else x2, w, btype, bias, out, t)
        return out.view(*x.shape[:-1], n)
    sk, grid = split_grid(x2, out, t, bias)
    jit.gguf_linear_kernel[grid](
        x2, w, sk.bias(bias, x2), sk.part, out, sk.counters,
        m, n, k, sk.k_per_split,
        x2.stride(0), w.stride(0), *sk.part_strides, out.stride(0),
        BTYPE=btype.type_id, HAS_BIAS=sk.fuse_bias,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, SUBS=t.subs,
        DOT_PRECISION=_precision(x.dtype), REDUCE=sk.reduce, num_warps=t.num_warps,
        num_stages=t.num_stages,
    )  # fmt: skip
    sk.finish(bias, out)
    return out.view(*x.shape[:-1], n)


def split_grid(
    x2, out, t: gguf_tiles.GGUFTiles, bias
) -> tuple[gemv_launch.SplitK, tuple[int, int, int]]:
    """The split-K plan and grid (row programs, N tiles, splits) of a decode linear."""
    (m, k), n = x2.shape, out.shape[1]
    n_tiles = triton.cdiv(n, t.block_n)
    k_per_split, splits = gguf_tiles.decode_split(m, n_tiles, k, t)
    m_programs = triton.cdiv(m, t.block_m)
    sk = gemv_launch.SplitK.plan(out, k_per_split, splits, m_programs * n_tiles, bias is not None)
    return sk, (m_programs, n_tiles, splits)


def _gemv_linear(x2, w, btype: BlockType, bias, out, t: gguf_tiles.GGUFTiles) -> None:
    """out (M, N) = x2 @ W^T (+ bias) in the GEMV form: `gguf_linear_gemv_kernel` (block_m
    1: grid (M, N tiles, splits)) or `gguf_linear_rows_kernel` (block_m 4: four rows a
    program, each tile decoded once for them); K split from the shape alone."""
    (m, k), n = x2.shape, out.shape[1]
    sk, grid = split_grid(x2, out, t, bias)
    args = (
        x2, w, sk.bias(bias, x2), sk.part, out, sk.counters,
        m, n, k, sk.k_per_split,
        x2.stride(0), w.stride(0), *sk.part_strides, out.stride(0),
    )  # fmt: skip
    consts = dict(BTYPE=btype.type_id, HAS_BIAS=sk.fuse_bias, BLOCK_N=t.block_n, SUBS=t.subs,
                  REDUCE=sk.reduce, num_warps=t.num_warps, **pdl.options(x2))  # fmt: skip
    if t.words:  # the four-row kernel's word path, one build for every row count
        if t.block_m != 4:
            raise ValueError(f"gguf linear: the word tiles (Q4_K, Q6_K, Q8_0) are four-row: {t}")
        jit.gguf_linear_rows_kernel[grid](*args, **consts, **gguf_tiles.words_consts(t))
    elif t.block_m == 1:
        jit.gguf_linear_gemv_kernel[grid](*args, **consts)
    else:
        jit.gguf_linear_rows_kernel[grid](*args, **consts)
    sk.finish(bias, out)


def _dequantized_linear(x2, w, btype: BlockType, bias, n: int, k: int) -> torch.Tensor:
    """x2 (M, K) @ W^T (+ bias) with W dequantized to x2's dtype, at most
    quant_prefill.CHUNK_BYTES of it at a time (an LM head of 151,936 x 2048 would be a 622
    MB copy): whole-weight `kernels.linear` where it fits, else column blocks of the output.
    Column blocks are cuBLAS calls of their own shape, whose kernel choice (so bits) may
    differ from one whole-weight F.linear: equal to the twin within rounding, not bit for bit;
    the same on every engine path (the blocks depend on the shapes only)."""
    row_bytes = k * x2.element_size()
    rows = max(128, quant_prefill.CHUNK_BYTES // row_bytes // 128 * 128)
    if rows >= n:
        return kernels.linear(x2, dequantize_weight(w, btype, k, x2.dtype), bias)
    out = x2.new_empty(x2.shape[0], n)
    dense = x2.new_empty(1, rows, k)
    for n0 in range(0, n, rows):
        part = dense[:, : min(rows, n - n0)]
        dequantize(w[n0 : n0 + part.shape[1]].unsqueeze(0), btype, k, part)
        b = None if bias is None else bias[n0 : n0 + part.shape[1]]
        out[:, n0 : n0 + part.shape[1]] = kernels.linear(x2, part[0], b)
    return out


def moe_merge_key(num_pairs: int, hidden: torch.Tensor) -> object | None:
    """The merge key of the GGUF block types: `quant_prefill`'s from PREFILL_MIN_PAIRS."""
    return quant_prefill.moe_merge_key(num_pairs, hidden, PREFILL_MIN_PAIRS)


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    btype13: BlockType,
    w2: torch.Tensor,
    btype2: BlockType,
    inter: int,
    use_gemv: bool | None = None,
    tiles: gguf_tiles.GGUFTiles | None = None,
    dequant: bool | None = None,
    max_ids: int | None = None,
    config: moe_launch.MoeConfig | None = None,
) -> torch.Tensor:
    """Routed experts: w13 (N, 2I, row bytes) in `btype13`, w2 (N, H, row bytes) in `btype2`,
    N experts or slots that `topk_ids` (T, k) index; weights float32 (T, k) → (T, H).
    `use_gemv` (default: at most MAX_GEMV_PAIRS pairs) or else the grouped path, there
    `dequant` (default from PREFILL_MIN_PAIRS pairs) the dequantized experts in the bf16
    grouped GEMMs (tiles `config`, default `grouped_config`) or the in-register ones
    (`tiles`). `max_ids`: at most this many distinct ids in `topk_ids` (an offloaded layer's
    E on its slot view: `quant_prefill.id_bound`, `moe_align.align_pairs`)."""
    if hidden.dim() != 2 or topk_ids.shape != topk_weights.shape:
        raise ValueError("gguf fused_moe: expected hidden (T, H) and topk_ids/weights (T, k)")
    if hidden.dtype not in _DTYPES or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError("gguf fused_moe: hidden must be bf16/fp16/fp32, one row per token")
    num_tokens, top_k = topk_ids.shape
    hidden_dim = hidden.shape[1]
    check_raw(w13, btype13, 2 * inter, hidden_dim, "gguf fused_moe w13")
    check_raw(w2, btype2, hidden_dim, inter, "gguf fused_moe w2")
    if w13.shape[0] != w2.shape[0]:
        raise ValueError(f"gguf fused_moe: w13 {tuple(w13.shape)} / w2 {tuple(w2.shape)} ids")
    num_pairs = num_tokens * top_k
    if use_gemv is None:
        use_gemv = num_pairs <= moe_launch.MAX_GEMV_PAIRS
    if use_gemv and Q8X_MOE and tiles is None and q8x.supports(btype13, btype2, w13, w2, inter):
        return q8x.fused_moe(hidden, topk_ids, topk_weights, w13, btype13, w2, btype2, inter)
    if dequant is None:
        dequant = num_pairs >= PREFILL_MIN_PAIRS
    if not use_gemv and dequant:

        def deq13(out, first, ids):
            dequantize(w13, btype13, hidden_dim, out, first, ids)

        def deq2(out, first, ids):
            dequantize(w2, btype2, inter, out, first, ids)

        return quant_prefill.fused_moe_with(
            hidden, topk_ids, topk_weights, w13.shape[0], inter, deq13, deq2, config,
            max_ids=max_ids,
        )  # fmt: skip
    hidden, topk_ids, topk_weights, out = moe_launch.moe_inputs(hidden, topk_ids, topk_weights)
    if num_pairs == 0:
        return out
    inter_buf = hidden.new_empty(num_pairs, inter)  # (T*k, I)
    y = hidden.new_empty(num_pairs, hidden_dim)  # (T*k, H) unweighted expert outputs
    s13 = (w13.stride(0), w13.stride(1))
    s2 = (w2.stride(0), w2.stride(1))
    if use_gemv:
        # gate/up and down each on the word path where its weights allow it (`q4k_words`),
        # else on the byte tile of w13's type (as before the word path)
        t = tiles or gguf_tiles.gemv_tiles(hidden.dtype, btype13)
        byte = lambda: gguf_tiles.gemv_tiles(hidden.dtype, btype13, words=False)  # noqa: E731
        t13 = gguf_tiles.path_tiles(t, w13, btype13, hidden_dim, byte)
        t2 = gguf_tiles.path_tiles(t.down or t, w2, btype2, inter, byte)
        if tiles is None and btype2.name != btype13.name:  # w2's own word tile, if any
            t2 = gguf_tiles.down_tiles(btype2, w2, inter, t2, byte)
        if t13.words:
            hidden = word_aligned(hidden)
        jit.gguf_moe_gate_up_gemv_kernel[(num_pairs, triton.cdiv(inter, t13.block_n))](
            hidden, topk_ids, w13, inter_buf, hidden_dim, inter,
            hidden.stride(0), *s13, inter_buf.stride(0),
            BTYPE=btype13.type_id, TOP_K=top_k, BLOCK_N=t13.block_n, SUBS=t13.subs,
            num_warps=t13.num_warps, **gguf_tiles.words_consts(t13),
            **pdl.options(hidden),
        )  # fmt: skip
        counters, fused = moe_launch.combine_tail(out, t2.block_n)
        jit.gguf_moe_down_gemv_kernel[(num_pairs, triton.cdiv(hidden_dim, t2.block_n))](
            inter_buf, topk_ids, w2, y, topk_weights, out, counters, hidden_dim, inter,
            inter_buf.stride(0), *s2, y.stride(0), out.stride(0),
            BTYPE=btype2.type_id, BLOCK_N=t2.block_n, SUBS=t2.subs, TOP_K=top_k,
            COMBINE=fused, num_warps=t2.num_warps, **gguf_tiles.words_consts(t2),
            **pdl.options(hidden),
        )  # fmt: skip
    else:
        fused = False
        t = tiles or gguf_tiles.grouped_tiles(num_pairs, hidden.dtype, btype13)
        sorted_pairs, block_ids, num_rows = moe_align.align_pairs(
            topk_ids, w13.shape[0], t.block_m, max_ids=max_ids
        )
        common = dict(
            BLOCK_M=t.block_m, BLOCK_N=t.block_n, SUBS=t.subs,
            DOT_PRECISION=_precision(hidden.dtype), num_warps=t.num_warps,
            num_stages=t.num_stages,
        )  # fmt: skip
        jit.gguf_moe_gate_up_grouped_kernel[(block_ids.numel() * triton.cdiv(inter, t.block_n),)](
            hidden, sorted_pairs, block_ids, num_rows, w13, inter_buf,
            num_pairs, hidden_dim, inter,
            hidden.stride(0), *s13, inter_buf.stride(0),
            BTYPE=btype13.type_id, TOP_K=top_k, **common,
        )  # fmt: skip
        grid = (block_ids.numel() * triton.cdiv(hidden_dim, t.block_n),)
        jit.gguf_moe_down_grouped_kernel[grid](
            inter_buf, sorted_pairs, block_ids, num_rows, w2, y,
            num_pairs, hidden_dim, inter,
            inter_buf.stride(0), *s2, y.stride(0),
            BTYPE=btype2.type_id, **common,
        )  # fmt: skip
    if not fused:
        moe_launch._combine(y, topk_weights, out, top_k)
    return out
