"""The prologue of the grouped (prefill) MoE kernels of `fused_moe`, `quant_moe` and
`gguf_gemm`: which tile of rows sorted by id (`moe_align.align_pairs`) and which tile of
output columns a program owns, the rows' (token, k) pairs and the tile's id.

A @triton.jit helper cannot return from its caller, so `moe_block` hands back a liveness
flag instead and every kernel opens with

    live, e, pairs, mask_m, offs_n, mask_n = moe_block(...)
    if not live:
        return  # beyond the padded rows actually used this call

The other loads are masked by `live`, so a dead program reads `num_rows` only, as it did
when each kernel returned right after that load."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def moe_block(
    sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, num_pairs, num_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """For program id p of a grid (row tiles * cdiv(num_cols, BLOCK_N),): row tile
    p // cdiv(num_cols, BLOCK_N), column tile p % cdiv(num_cols, BLOCK_N). Returns
    live (the row tile lies below num_rows, the padded rows used this call), e (the tile's
    id, int64), pairs (BLOCK_M,) int32 (pair index, num_pairs for padding), mask_m (the rows
    that are pairs), offs_n (BLOCK_N,) (the output columns) and mask_n (offs_n < num_cols)."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(num_cols, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    num_rows = tl.load(num_rows_ptr)
    live = pid_m * BLOCK_M < num_rows
    # `live` for every row, compared as a block: the interpreter would hand a broadcast `live`
    # to tl.load as an int32 mask (it types a comparison like its operands), and reject it
    live_m = tl.full((BLOCK_M,), pid_m * BLOCK_M, tl.int32) < num_rows
    e = tl.load(block_ids_ptr + pid_m, mask=live, other=0).to(tl.int64)
    pairs_ptrs = sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pairs_ptrs, mask=live_m, other=num_pairs)
    mask_m = pairs < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < num_cols
    return live, e, pairs, mask_m, offs_n, mask_n
