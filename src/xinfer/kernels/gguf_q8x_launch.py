"""Launchers of the GGUF decode GEMVs on int8 activations (`triton/gguf_q8x.py`): the routed
experts and the linears of Q4_K, Q8_0 and Q6_K weights with the activations quantized per
32 to int8 in each program and the codes multiplied four at a time (`dp4a`), as llama.cpp's
MMVQ kernels do, instead of every weight dequantized to float and multiplied
(`gguf_launch`'s GEMVs).

Not the default: `gguf_launch.Q8X_MOE` and `Q8X_LINEAR` turn them on once the H200 has
timed them against the float GEMVs (`bench/bench_gguf_kernels.py`). Numerics: int8
activations are an approximation of their own (as llama.cpp's), equal to
`gguf_q8x_reference` (the twin), not to the float twin bit for bit. A row's result depends
on its own activations only, so the bits do not depend on the batch or on which slot holds
the expert; K splits and tiles come from the shapes alone."""

from __future__ import annotations

import torch
import triton

from xinfer import kernels
from xinfer.kernels import gemv_launch, moe_launch
from xinfer.kernels.triton import gguf_q8x as jit
from xinfer.quant.gguf_blocks import BlockType

GATE_UP_BLOCK_N = 32  # gate (and up) rows a gate/up program: fixed, one block of 32 of h to
# quantize for down (the kernel's tile)
DOWN_BLOCK_N = 32  # rows of W2 a program of the down GEMV
LINEAR_BLOCK_N = 32  # rows of W a program of the linear
NUM_WARPS = 4  # of every q8x program
# bench/sweep_q8x.py on an H100 (2026-12-05): MoE best at 2 warps, 16 down rows (34.3 µs, float
# GEMV 31.9); qkv linear best at 1 warp, 8 rows (9.2 µs, float one-row 11.2). Not adopted:
# the switches are off, and smaller tiles mean more interpreter programs in CI.


_TYPES = ("Q4_K", "Q8_0", "Q6_K")  # Q4_K rows read as 4-byte words, the others by halves


def _readable(btype: BlockType, w: torch.Tensor, k: int) -> bool:
    """Raw rows (..., row bytes) of `btype` over K columns this module reads: Q4_K, Q8_0 or
    Q6_K (K a multiple of 256; 32 for Q8_0), rows aligned to the element they are read by."""
    if btype.name not in _TYPES or k % (32 if btype.name == "Q8_0" else 256):
        return False  # Q8_0 rows may end inside a step of 256 (Qwen1.5's 1408 under ISQ)
    size = 4 if btype.name == "Q4_K" else 2
    return w.stride()[-1] == 1 and kernels.rows_aligned(w, size)


def supports(
    btype13: BlockType, btype2: BlockType, w13: torch.Tensor, w2: torch.Tensor, inter: int
) -> bool:
    """Whether these experts run here: gate/up and down each Q4_K, Q8_0 or Q6_K (a Q4_K_M
    file's mix), hidden and intermediate sizes whole rows of their types."""
    return _readable(btype13, w13, w2.shape[1]) and _readable(btype2, w2, inter)


def supports_linear(btype: BlockType, w: torch.Tensor, k: int) -> bool:
    """Whether a decode linear of K columns runs here."""
    return _readable(btype, w, k)


def _rows(w: torch.Tensor, btype: BlockType) -> tuple:
    """(the view the kernels read the rows through — int32 words for Q4_K, int16 halves for
    Q8_0 and Q6_K —, its strides in those elements (all but the last), the ggml type id)."""
    size = 4 if btype.name == "Q4_K" else 2
    view = w.view(torch.int32 if size == 4 else torch.int16)
    return (view, *(st // size for st in w.stride()[:-1]), btype.type_id)


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    btype13: BlockType,
    w2: torch.Tensor,
    btype2: BlockType,
    inter: int,
) -> torch.Tensor:
    """Routed experts of w13 (E, 2I, row bytes) and w2 (E, H, row bytes) that `topk_ids`
    (T, k) index (`supports` holds): (T, H) in hidden's dtype. Two launches, as the float
    GEMVs: gate/up (which quantizes the hidden rows in its loop and its own output for
    down), down (which sums each token's pairs in its last programs)."""
    hidden, topk_ids, topk_weights, out = moe_launch.moe_inputs(hidden, topk_ids, topk_weights)
    num_tokens, top_k = topk_ids.shape
    num_pairs, hidden_dim = num_tokens * top_k, hidden.shape[1]
    if num_pairs == 0:
        return out
    asm = kernels.inline_asm()
    iw = torch.empty(num_pairs, inter // 4, dtype=torch.int32, device=hidden.device)
    idd = torch.empty(num_pairs, inter // 32, dtype=torch.float32, device=hidden.device)
    iss = torch.empty_like(idd)
    w13x, swe13, swn13, type13 = _rows(w13, btype13)
    jit.q8x_moe_gate_up_kernel[(num_pairs, inter // GATE_UP_BLOCK_N)](
        hidden, topk_ids, w13, w13x, iw, idd, iss, hidden_dim, inter,
        hidden.stride(0), swe13, swn13, iw.stride(0), idd.stride(0),
        TOP_K=top_k, WTYPE=type13, ASM=asm, num_warps=NUM_WARPS,
    )  # fmt: skip
    y = hidden.new_empty(num_pairs, hidden_dim)  # (T*k, H) unweighted expert outputs
    counters, fused = moe_launch.combine_tail(out, DOWN_BLOCK_N)
    w2x, swe2, swn2, type2 = _rows(w2, btype2)
    jit.q8x_moe_down_kernel[(num_pairs, triton.cdiv(hidden_dim, DOWN_BLOCK_N))](
        iw, idd, iss, topk_ids, w2, w2x, y, topk_weights, out, counters, hidden_dim, inter,
        iw.stride(0), idd.stride(0), swe2, swn2, y.stride(0), out.stride(0),
        BLOCK_N=DOWN_BLOCK_N, TOP_K=top_k, COMBINE=fused, WTYPE=type2, ASM=asm,
        num_warps=NUM_WARPS,
    )  # fmt: skip
    if not fused:
        moe_launch._combine(y, topk_weights, out, top_k)
    return out


def linear(
    x2: torch.Tensor, w: torch.Tensor, btype: BlockType, bias: torch.Tensor | None, n: int
) -> torch.Tensor:
    """x2 (M, K) @ W^T (+ bias) in x2's dtype, W the rows (N, row bytes) of `btype`
    (`supports_linear` holds; M <= gemv_launch.DECODE_ROWS): one x row a program, K split
    from the shape alone (`gemv_launch.decode_split`, whole steps of 256), the partials
    added by each tile's last split."""
    m, k = x2.shape
    out = x2.new_empty(m, n)
    if m == 0:
        return out
    n_tiles = triton.cdiv(n, LINEAR_BLOCK_N)
    k_per_split, splits = gemv_launch.decode_split(m, n_tiles, k, 256)
    sk = gemv_launch.SplitK.plan(out, k_per_split, splits, m * n_tiles, bias is not None)
    wx, swn, wtype = _rows(w, btype)
    jit.q8x_linear_kernel[(m, n_tiles, splits)](
        x2, w, wx, sk.bias(bias, x2), sk.part, out, sk.counters, m, n, k, k_per_split,
        x2.stride(0), swn, *sk.part_strides, out.stride(0),
        HAS_BIAS=sk.fuse_bias, BLOCK_N=LINEAR_BLOCK_N, REDUCE=sk.reduce, WTYPE=wtype,
        ASM=kernels.inline_asm(), num_warps=NUM_WARPS,
    )  # fmt: skip
    sk.finish(bias, out)
    return out
