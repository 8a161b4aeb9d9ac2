"""The decode linear of a weight stored as two GGUF segments of different block types (a
Q4_K_M file's q|k in Q4_K above its v in Q6_K: `quant/gguf_segments.py`), launched from
`kernels/gguf_segments_launch.py`: one launch whose programs over the first segment's row
tiles read its blocks in its type, the rest the second's, each by the four-row word dot of
`gguf_gemm.gguf_linear_rows_kernel`, so a row's bits are that kernel's for its segment."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.gemv import four_rows, store_split_tile
from xinfer.kernels.triton.gguf_gemm import words_four_rows
from xinfer.kernels.triton.pdl import wait_for_producers


@triton.jit(do_not_specialize=["M"])
def gguf_linear_segments_kernel(
    x_ptr, wa_ptr, wb_ptr, bias_ptr, out_ptr, final_ptr, count_ptr,
    M, N, N_A, K, k_per_split,
    stride_xm, stride_wa, stride_wb, stride_os, stride_om, stride_fm,
    BTYPE_A: tl.constexpr, BTYPE_B: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, SUBS: tl.constexpr, REDUCE: tl.constexpr,
    USE_PDL: tl.constexpr = False, ASM: tl.constexpr = False, ROWS_T: tl.constexpr = 1,
):  # fmt: skip
    """grid (cdiv(M, 4), cdiv(N, BLOCK_N), splits): out (M, N) = x @ W^T (+ bias), W's rows
    0 .. N_A (a multiple of BLOCK_N) the `BTYPE_A` rows at `wa_ptr`, rows N_A .. N the
    `BTYPE_B` rows at `wb_ptr`; four rows of x a program, K split and stored as
    `gguf_linear_rows_kernel` does (word path only: both segments' rows allow it)."""
    wait_for_producers(USE_PDL)
    m0 = tl.program_id(0) * 4
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    x0 = x_ptr + m0.to(tl.int64) * stride_xm
    tiles_a = N_A // BLOCK_N
    if pid_n < tiles_a:
        y0, y1, y2, y3 = words_four_rows(
            x0, stride_xm, M - m0, wa_ptr, pid_n * BLOCK_N, N_A, stride_wa, split, k_per_split,
            K, BTYPE_A, ROWS_T, SUBS // 8, ASM,
        )  # fmt: skip
    else:  # rows past N: segment B's last, dropped at the store
        y0, y1, y2, y3 = words_four_rows(
            x0, stride_xm, M - m0, wb_ptr, (pid_n - tiles_a) * BLOCK_N, N - N_A, stride_wb,
            split, k_per_split, K, BTYPE_B, ROWS_T, SUBS // 8, ASM,
        )  # fmt: skip
    tile = (m0 // 4) * tl.num_programs(1) + pid_n
    y = four_rows(y0, y1, y2, y3)
    offs_m = m0 + tl.arange(0, 4)
    store_split_tile(
        y, out_ptr, bias_ptr, final_ptr, count_ptr, tile, split, tl.num_programs(2), offs_m,
        offs_n, offs_m < M, offs_n < N, stride_os, stride_om, stride_fm, HAS_BIAS, REDUCE, 4,
        BLOCK_N,
    )  # fmt: skip
