"""Launchers of the GGUF decode GEMVs on int8 activations (`triton/gguf_q8x.py`): the routed
experts and the linears of Q4_K weights with the activations quantized per 32 to int8 in
each program and the codes multiplied four at a time (`dp4a`), as llama.cpp's MMVQ kernels
do, instead of every weight dequantized to float and multiplied (`gguf_launch`'s GEMVs).

Not the default: `gguf_launch.Q8X_MOE` and `Q8X_LINEAR` turn them on once the H200 has
timed them against the float GEMVs (`bench/bench_gguf_kernels.py`). Numerics: int8
activations are an approximation of their own (as llama.cpp's), equal to
`gguf_q8x_reference` (the twin), not to the float twin bit for bit. A row's result depends
on its own activations only, so the bits do not depend on the batch or on which slot holds
the expert; K splits and tiles come from the shapes alone."""

from __future__ import annotations

import os

import torch
import triton

from xinfer.kernels import gemv_launch, moe_launch
from xinfer.kernels.triton import gguf_q8x as jit
from xinfer.quant.gguf_blocks import BlockType

GATE_UP_BLOCK_N = 32  # gate (and up) rows a gate/up program: one block of 32 to quantize
DOWN_BLOCK_N = 32  # rows of W2 a program of the down GEMV
LINEAR_BLOCK_N = 32  # rows of W a program of the linear


def _asm() -> bool:
    """dp4a and mul.rn as inline PTX, except in Triton's CPU interpreter (no inline assembly
    there: shifts and multiplies with the same results)."""
    return os.environ.get("TRITON_INTERPRET", "0") != "1"


def _word_rows(w: torch.Tensor) -> bool:
    """Raw rows (..., row bytes) readable as 4-byte words."""
    return (
        w.stride(-1) == 1 and w.data_ptr() % 4 == 0 and all(st % 4 == 0 for st in w.stride()[:-1])
    )


def supports(
    btype13: BlockType, btype2: BlockType, w13: torch.Tensor, w2: torch.Tensor, inter: int
) -> bool:
    """Whether these experts run here: Q4_K gate/up and down, rows of whole super-blocks
    (hidden and intermediate sizes multiples of 256), read as 4-byte words."""
    hidden_dim = w2.shape[1]
    return (
        btype13.name == "Q4_K"
        and btype2.name == "Q4_K"
        and hidden_dim % 256 == 0
        and inter % 256 == 0
        and _word_rows(w13)
        and _word_rows(w2)
    )


def supports_linear(btype: BlockType, w: torch.Tensor, k: int) -> bool:
    """Whether a Q4_K linear of K columns runs here (whole super-blocks, word rows)."""
    return btype.name == "Q4_K" and k % 256 == 0 and _word_rows(w)


def _words(w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The int32 view of raw rows w (..., row bytes) and its strides in words (all but the
    last)."""
    return (w.view(torch.int32), *(st // 4 for st in w.stride()[:-1]))


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    inter: int,
) -> torch.Tensor:
    """Routed experts of Q4_K w13 (E, 2I, row bytes) and w2 (E, H, row bytes) that
    `topk_ids` (T, k) index (`supports` holds): (T, H) in hidden's dtype. Two launches, as
    the float GEMVs: gate/up (which quantizes the hidden rows in its loop and its own
    output for down), down (which sums each token's pairs in its last programs)."""
    hidden, topk_ids, topk_weights, out = moe_launch.moe_inputs(hidden, topk_ids, topk_weights)
    num_tokens, top_k = topk_ids.shape
    num_pairs, hidden_dim = num_tokens * top_k, hidden.shape[1]
    if num_pairs == 0:
        return out
    asm = _asm()
    iw = torch.empty(num_pairs, inter // 4, dtype=torch.int32, device=hidden.device)
    idd = torch.empty(num_pairs, inter // 32, dtype=torch.float32, device=hidden.device)
    iss = torch.empty_like(idd)
    w13_32, swe13, swn13 = _words(w13)
    jit.q4k_moe_gate_up_q8x_kernel[(num_pairs, inter // 32)](
        hidden, topk_ids, w13, w13_32, iw, idd, iss, hidden_dim, inter,
        hidden.stride(0), swe13, swn13, iw.stride(0), idd.stride(0),
        TOP_K=top_k, ASM=asm, num_warps=4,
    )  # fmt: skip
    y = hidden.new_empty(num_pairs, hidden_dim)  # (T*k, H) unweighted expert outputs
    counters, fused = moe_launch.combine_tail(out, DOWN_BLOCK_N)
    w2_32, swe2, swn2 = _words(w2)
    jit.q4k_moe_down_q8x_kernel[(num_pairs, triton.cdiv(hidden_dim, DOWN_BLOCK_N))](
        iw, idd, iss, topk_ids, w2, w2_32, y, topk_weights, out, counters, hidden_dim, inter,
        iw.stride(0), idd.stride(0), swe2, swn2, y.stride(0), out.stride(0),
        BLOCK_N=DOWN_BLOCK_N, TOP_K=top_k, COMBINE=fused, ASM=asm, num_warps=4,
    )  # fmt: skip
    if not fused:
        moe_launch._combine(y, topk_weights, out, top_k)
    return out


def linear(x2: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """x2 (M, K) @ W^T (+ bias) in x2's dtype, W the Q4_K rows (N, row bytes)
    (`supports_linear` holds; M <= gemv_launch.DECODE_ROWS): one x row a program, K split
    from the shape alone (`gemv_launch.decode_split`, whole super-blocks), the partials
    added by each tile's last split."""
    m, k = x2.shape
    out = x2.new_empty(m, n)
    if m == 0:
        return out
    n_tiles = triton.cdiv(n, LINEAR_BLOCK_N)
    k_per_split, splits = gemv_launch.decode_split(m, n_tiles, k, 256)
    sk = gemv_launch.SplitK.plan(out, k_per_split, splits, m * n_tiles, bias is not None)
    w32, swn = _words(w)
    jit.q4k_linear_q8x_kernel[(m, n_tiles, splits)](
        x2, w, w32, sk.bias(bias, x2), sk.part, out, sk.counters, m, n, k, k_per_split,
        x2.stride(0), swn, *sk.part_strides, out.stride(0),
        HAS_BIAS=sk.fuse_bias, BLOCK_N=LINEAR_BLOCK_N, REDUCE=sk.reduce, ASM=_asm(),
        num_warps=4,
    )  # fmt: skip
    sk.finish(bias, out)
    return out
