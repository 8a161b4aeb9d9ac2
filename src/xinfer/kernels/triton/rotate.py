"""Rows times a small square matrix, y = x @ M (x (R, D), M (D, D), D <= 256): the
TurboQuant cache's rotations of q, k, v and the attention output (`kernels/kv_turbo.py`).

Why not a cuBLAS matmul: cuBLAS picks its kernel (and with it the order in which a row's
products are summed) from the number of rows, so a row's bits could depend on how many other
rows share the call, i.e. on the batch. Here every call has the same tiles: 16 rows a
program, the columns of M in BLOCK_N-wide tiles, the D products summed in BLOCK_K steps in
the same order; rows past R are masked to zero and never meet a real row's sum. A row's
result depends on that row and M alone. Float32 accumulation, rounded once to out's dtype.
It opens with `wait_for_producers`, so it may take PDL (`kernels/pdl.py`)."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.pdl import wait_for_producers

BLOCK_R: tl.constexpr = tl.constexpr(16)  # rows a program (tl.dot's smallest M), fixed


@triton.jit
def rotate_rows_kernel(
    x_ptr, m_ptr, out_ptr, rows,
    stride_x, stride_mk, stride_mn, stride_o,
    D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """grid (cdiv(rows, BLOCK_R), cdiv(D, BLOCK_N)): out[r, n] = sum_k x[r, k] M[k, n]."""
    wait_for_producers(USE_PDL)
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_r = r < rows
    mask_n = n < D
    x_rows = x_ptr + r.to(tl.int64)[:, None] * stride_x
    acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    for k0 in tl.static_range(0, D, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + ks[None, :], mask=mask_r[:, None] & (ks[None, :] < D), other=0.0)
        m = tl.load(
            m_ptr + ks[:, None] * stride_mk + n[None, :] * stride_mn,
            mask=(ks[:, None] < D) & mask_n[None, :],
            other=0.0,
        )
        acc = tl.dot(x, m, acc, input_precision=DOT_PRECISION)
    out = out_ptr + r.to(tl.int64)[:, None] * stride_o + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_r[:, None] & mask_n[None, :])
