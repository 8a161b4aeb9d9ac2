"""Launchers of the GGUF block kernels (`triton/gguf_gemm.py`): `linear` and `fused_moe` on raw
block rows uint8 (N, K / block_size * type_size). Called through `GGUFFormat.triton_*` on
CUDA tensors (and by the tests on CPU tensors under TRITON_INTERPRET=1). No host sync: safe
in CUDA graphs.

Determinism: tiles depend only on (M <= DECODE_M or not, dtype) for linears and on (T*k vs
MAX_GEMV_PAIRS, dtype, block type) for experts, never on ids; so a decode row's bits do not
depend on the batch, and an expert's bits do not depend on which slot holds it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from xinfer.kernels import gemv_launch, moe_launch
from xinfer.kernels.triton import gguf_gemm as jit
from xinfer.quant.gguf_blocks import BlockType

DECODE_M = gemv_launch.DECODE_ROWS  # linears with at most this many rows: one 16-row tile
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class GGUFTiles:
    """BLOCK_M (dot paths only), BLOCK_N rows per program, SUBS sub-blocks of 32 per step."""

    block_m: int
    block_n: int
    subs: int
    num_warps: int = 4
    num_stages: int = 2
    split_programs: int | None = None  # decode linears' split-K target (None: the default)


def linear_tiles(m: int, dtype: torch.dtype) -> GGUFTiles:
    if m <= DECODE_M:  # weight-bound: narrow N tiles give every SM work
        return GGUFTiles(block_m=16, block_n=16, subs=8, num_warps=4)
    if dtype == torch.float32:
        return GGUFTiles(block_m=32, block_n=32, subs=2, num_warps=4)
    return GGUFTiles(block_m=64, block_n=64, subs=2, num_warps=8)


_SWEPT_GEMV = {  # w13's block type → its swept best MoE GEMV tile
    "Q4_K": GGUFTiles(block_m=1, block_n=4, subs=8, num_warps=2),
    "Q8_0": GGUFTiles(block_m=1, block_n=4, subs=4, num_warps=2),
}
_SWEPT_GROUPED = {  # w13's block type → its swept best grouped tile at many rows
    "Q4_K": GGUFTiles(block_m=64, block_n=64, subs=2, num_warps=4),
    "Q8_0": GGUFTiles(block_m=64, block_n=64, subs=4, num_warps=4),
}


def gemv_tiles(dtype: torch.dtype, btype: BlockType | None = None) -> GGUFTiles:
    """MoE decode: one program per (pair, BLOCK_N rows); SUBS=8 reads whole super-blocks.
    Swept on the H200 (bench_gguf_kernels.py --sweep, Qwen3-30B-A3B shape, 2026-12-04 fifth
    session, activations in registers), µs for 1 / 8 tokens: Q4_K 4 rows of 2 warps, 31.1 /
    196.0 (best of 24 tiles 30.7 at one token: within noise); Q8_0 4 rows of 2 warps and 4
    blocks a step, 31.4 / 179.3 against 44.9 / 245.2 for the general tile. The other types
    are not swept."""
    del dtype
    return _SWEPT_GEMV.get(btype.name if btype else "", GGUFTiles(1, 8, 8, num_warps=4))


def grouped_tiles(num_pairs: int, dtype: torch.dtype, btype: BlockType | None = None) -> GGUFTiles:
    """MoE prefill. At many rows, 2048 tokens of the Qwen3-30B-A3B shape on the H200
    (bench_gguf_kernels.py --sweep): Q4_K 4 warps, 2,843 vs 3,156 µs (2026-12-04; 2,256 µs
    in the fifth session's run); Q8_0 4 warps and 4 blocks a step, 2,041 vs 2,326 µs (fifth
    session, best of 16 tiles). The others are not swept."""
    if dtype == torch.float32:
        return GGUFTiles(block_m=32, block_n=32, subs=2, num_warps=4)
    if num_pairs <= 1024:  # few rows per expert: small M, many programs
        return GGUFTiles(block_m=16, block_n=64, subs=4, num_warps=4)
    return _SWEPT_GROUPED.get(btype.name if btype else "", GGUFTiles(64, 64, 2, num_warps=8))


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _check_raw(w: torch.Tensor, btype: BlockType, rows: int, k: int, what: str) -> None:
    if w.dtype != torch.uint8 or w.shape[-2:] != (rows, btype.row_bytes(k)):
        raise ValueError(
            f"{what}: expected {btype.name} rows uint8 (..., {rows}, {btype.row_bytes(k)}), "
            f"got {w.dtype} {tuple(w.shape)}"
        )
    if w.stride(-1) != 1:
        raise ValueError(f"{what}: block rows must be contiguous in their last dim")


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    btype: BlockType,
    bias: torch.Tensor | None,
    n: int,
    k: int,
    tiles: GGUFTiles | None = None,
) -> torch.Tensor:
    """x (..., K) @ W^T (+ bias) in x's dtype; W (N, K) stored as `btype` blocks (N, row bytes)."""
    _check_raw(w, btype, n, k, "gguf linear")
    if x.dtype not in _DTYPES or x.shape[-1] != k:
        raise ValueError(f"gguf linear: x {x.dtype} {tuple(x.shape)} for K={k}")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = x.new_empty(m, n)
    if m == 0:
        return out.view(*x.shape[:-1], n)
    t = tiles or linear_tiles(m, x.dtype)
    n_tiles = triton.cdiv(n, t.block_n)
    k_per_split, splits = decode_split(m, n_tiles, k, t)
    part = out if splits == 1 else out.new_empty(splits, m, n, dtype=torch.float32)
    fuse_bias = bias is not None and splits == 1
    jit.gguf_linear_kernel[(triton.cdiv(m, t.block_m), n_tiles, splits)](
        x2, w, bias if fuse_bias else x2, part,
        m, n, k, k_per_split,
        x2.stride(0), w.stride(0), part.stride(0) if splits > 1 else 0, part.stride(-2),
        BTYPE=btype.type_id, HAS_BIAS=fuse_bias,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, SUBS=t.subs,
        DOT_PRECISION=_precision(x.dtype), num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    if splits > 1:
        gemv_launch.reduce_splits(part, bias, out)
    return out.view(*x.shape[:-1], n)


def decode_split(m: int, n_tiles: int, k: int, t: GGUFTiles) -> tuple[int, int]:
    """(K per split, splits) of a linear (`gemv_launch.decode_split`), in whole chunks of
    SUBS * 32 sub-blocks."""
    return gemv_launch.decode_split(m, n_tiles, k, t.subs * 32, t.split_programs)


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
    tiles: GGUFTiles | None = None,
) -> torch.Tensor:
    """Routed experts: w13 (N, 2I, row bytes) in `btype13`, w2 (N, H, row bytes) in `btype2`,
    N experts or slots that `topk_ids` (T, k) index; weights float32 (T, k) → (T, H)."""
    if hidden.dim() != 2 or topk_ids.shape != topk_weights.shape:
        raise ValueError("gguf fused_moe: expected hidden (T, H) and topk_ids/weights (T, k)")
    if hidden.dtype not in _DTYPES or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError("gguf fused_moe: hidden must be bf16/fp16/fp32, one row per token")
    num_tokens, top_k = topk_ids.shape
    hidden_dim = hidden.shape[1]
    _check_raw(w13, btype13, 2 * inter, hidden_dim, "gguf fused_moe w13")
    _check_raw(w2, btype2, hidden_dim, inter, "gguf fused_moe w2")
    if w13.shape[0] != w2.shape[0]:
        raise ValueError(f"gguf fused_moe: w13 {tuple(w13.shape)} / w2 {tuple(w2.shape)} ids")
    num_pairs = num_tokens * top_k
    hidden, topk_ids, topk_weights, out = moe_launch.moe_inputs(hidden, topk_ids, topk_weights)
    if num_pairs == 0:
        return out
    if use_gemv is None:
        use_gemv = num_pairs <= moe_launch.MAX_GEMV_PAIRS
    inter_buf = hidden.new_empty(num_pairs, inter)  # (T*k, I)
    y = hidden.new_empty(num_pairs, hidden_dim)  # (T*k, H) unweighted expert outputs
    s13 = (w13.stride(0), w13.stride(1))
    s2 = (w2.stride(0), w2.stride(1))
    if use_gemv:
        t = tiles or gemv_tiles(hidden.dtype, btype13)
        jit.gguf_moe_gate_up_gemv_kernel[(num_pairs, triton.cdiv(inter, t.block_n))](
            hidden, topk_ids, w13, inter_buf, hidden_dim, inter,
            hidden.stride(0), *s13, inter_buf.stride(0),
            BTYPE=btype13.type_id, TOP_K=top_k, BLOCK_N=t.block_n, SUBS=t.subs,
            num_warps=t.num_warps,
        )  # fmt: skip
        jit.gguf_moe_down_gemv_kernel[(num_pairs, triton.cdiv(hidden_dim, t.block_n))](
            inter_buf, topk_ids, w2, y, hidden_dim, inter,
            inter_buf.stride(0), *s2, y.stride(0),
            BTYPE=btype2.type_id, BLOCK_N=t.block_n, SUBS=t.subs, num_warps=t.num_warps,
        )  # fmt: skip
    else:
        t = tiles or grouped_tiles(num_pairs, hidden.dtype, btype13)
        sorted_pairs, block_ids, num_rows = moe_launch.align_pairs(
            topk_ids, w13.shape[0], t.block_m
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
    moe_launch._combine(y, topk_weights, out, top_k)
    return out
