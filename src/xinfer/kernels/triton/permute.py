"""x's columns in an act-order weight's order (`quant/act_order.py`), gathered once so that
the plain int4 kernels run on it and load x as vectors: for a linear, out[m, j] =
x[m, perm[j]]; for the routed experts' kernels, one row a (token, expert) pair in that
expert's order. Loading x through perm inside the kernels measured 1.8x the plain kernel's
time for decode linears, 1.2x for the MoE GEMV and 2.9x for the 2,048-token expert GEMM on
the H100 (thirtieth session). Copies, so a row's bits never depend on the batch. They read
an int16 or int32 perm as stored and open with `wait_for_producers` (PDL)."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.pdl import wait_for_producers


@triton.jit
def permute_columns_kernel(
    x_ptr, perm_ptr, out_ptr, K, stride_x, stride_o,
    BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """grid (M, cdiv(K, BLOCK_K)): one row's BLOCK_K output columns."""
    wait_for_producers(USE_PDL)
    m = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = j < K
    src = tl.load(perm_ptr + j, mask=mask, other=0).to(tl.int64)
    x = tl.load(x_ptr + m * stride_x + src, mask=mask)
    tl.store(out_ptr + m * stride_o + j, x, mask=mask)


@triton.jit
def permute_pair_rows_kernel(
    x_ptr, ids_ptr, perm_ptr, out_ptr, K, stride_x, stride_pe, stride_o,
    TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """grid (T * TOP_K, cdiv(K, BLOCK_K)): pair p's row, out[p, j] = x[p // TOP_K,
    perm[ids[p], j]] (its expert's column order; a negative id writes zeros). The routed
    experts' kernels on act-order codes read these rows as plain rows, one a pair."""
    wait_for_producers(USE_PDL)
    p = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    e = tl.load(ids_ptr + p).to(tl.int64)
    mask = j < K
    src = tl.load(perm_ptr + tl.maximum(e, 0) * stride_pe + j, mask=mask, other=0).to(tl.int64)
    x = tl.load(x_ptr + (p // TOP_K) * stride_x + src, mask=mask, other=0.0)
    tl.store(out_ptr + p * stride_o + j, tl.where(e >= 0, x, 0.0).to(x.dtype), mask=mask)
