"""RMSNorm, optionally fused with the residual add: one program per row, HF numerics
(normalise in float32, round to the activation dtype, then multiply by the weight)."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.pdl import wait_for_producers


@triton.jit
def rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,  # (rows, N) contiguous
    res_out_ptr,  # (rows, N) contiguous, written only with HAS_RESIDUAL
    inner,  # rows are indexed (row // inner, row % inner) so (T, H, D) views need no copy
    stride_x0,
    stride_x1,
    stride_r0,
    stride_r1,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    wait_for_producers(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    i0, i1 = row // inner, row % inner
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + i0 * stride_x0 + i1 * stride_x1 + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + i0 * stride_r0 + i1 * stride_r1 + cols, mask=mask, other=0.0)
        # torch adds in float32 and rounds once to the result dtype: same bits here
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols
    normed = (xf * tl.rsqrt(var + eps)).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)  # exact product, rounded once on store
    tl.store(out_ptr + row * n_cols + cols, out.to(out_ptr.dtype.element_ty), mask=mask)
