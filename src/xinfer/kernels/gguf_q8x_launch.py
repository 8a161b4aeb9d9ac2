"""Launchers of the GGUF expert GEMVs on int8 activations (`triton/gguf_q8x.py`): the
decode MoE of Q4_K experts with the activations quantized per 32 to int8 and the codes
multiplied four at a time (`dp4a`), as llama.cpp's MMVQ kernels do, instead of every
weight dequantized to float and multiplied (`gguf_launch.fused_moe`'s GEMVs). Three
launches: the hidden rows quantized, the gate/up GEMV (which quantizes its own output for
the down GEMV), the down GEMV (which sums each token's pairs in its last program).

Not the default: `gguf_launch.Q8X_MOE` turns it on once the H200 has timed it against the
float GEMVs (`bench/bench_gguf_kernels.py`). Numerics: int8 activations are an
approximation of their own (as llama.cpp's), equal to `gguf_q8x_reference` (the twin),
not to the float twin bit for bit. A pair's result depends on its token's row only, so the
bits do not depend on the batch or on which slot holds the expert."""

from __future__ import annotations

import os

import torch
import triton

from xinfer.kernels import moe_launch
from xinfer.kernels.triton import gguf_q8x as jit
from xinfer.quant.gguf_blocks import BlockType

QUANT_BLOCKS = 8  # blocks of 32 a program of the activation quantizer
DOWN_BLOCK_N = 32  # rows of W2 a program of the down GEMV (sm_90 SASS: 0.146 warp-instr a
# weight a loop iteration; 16 rows: 0.171, 64: 0.132 at 123 registers)


def _asm() -> bool:
    """dp4a as inline PTX, except in Triton's CPU interpreter (no inline assembly there)."""
    return os.environ.get("TRITON_INTERPRET", "0") != "1"


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
        and all(t.stride(0) % 4 == 0 and t.stride(1) % 4 == 0 for t in (w13, w2))
        and all(t.data_ptr() % 4 == 0 and t.stride(-1) == 1 for t in (w13, w2))
    )


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (M, K) → (words (M, K/4) int32, d (M, K/32), d·Σq (M, K/32) float32): the int8
    codes of each block of 32, four a word (`gguf_q8x_reference.quantize_rows`)."""
    m, k = x.shape
    if k % 32:
        raise ValueError(f"q8x quantize: K={k} is not a multiple of 32")
    words = torch.empty(m, k // 4, dtype=torch.int32, device=x.device)
    d = torch.empty(m, k // 32, dtype=torch.float32, device=x.device)
    s = torch.empty_like(d)
    if m:
        jit.quantize_q8x_kernel[(m, triton.cdiv(k // 32, QUANT_BLOCKS))](
            x, words, d, s, k, x.stride(0), words.stride(0), d.stride(0), S=QUANT_BLOCKS,
            num_warps=4,
        )  # fmt: skip
    return words, d, s


def _words(w: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """The int32 view of raw rows w (E, N, row bytes) and its (expert, row) strides in words."""
    return w.view(torch.int32), w.stride(0) // 4, w.stride(1) // 4


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    inter: int,
) -> torch.Tensor:
    """Routed experts of Q4_K w13 (E, 2I, row bytes) and w2 (E, H, row bytes) that
    `topk_ids` (T, k) index (`supports` holds): (T, H) in hidden's dtype."""
    hidden, topk_ids, topk_weights, out = moe_launch.moe_inputs(hidden, topk_ids, topk_weights)
    num_tokens, top_k = topk_ids.shape
    num_pairs, hidden_dim = num_tokens * top_k, hidden.shape[1]
    if num_pairs == 0:
        return out
    asm = _asm()
    xw, xd, xs = quantize(hidden)
    iw = torch.empty(num_pairs, inter // 4, dtype=torch.int32, device=hidden.device)
    idd = torch.empty(num_pairs, inter // 32, dtype=torch.float32, device=hidden.device)
    iss = torch.empty_like(idd)
    w13_32, swe13, swn13 = _words(w13)
    jit.q4k_moe_gate_up_q8x_kernel[(num_pairs, inter // 32)](
        xw, xd, xs, topk_ids, w13, w13_32, iw, idd, iss, hidden_dim, inter,
        xw.stride(0), xd.stride(0), swe13, swn13, iw.stride(0), idd.stride(0),
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
