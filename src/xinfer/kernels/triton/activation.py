"""Triton activation kernels (launched from `xinfer.kernels.moe_launch`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def silu_and_mul_kernel(
    x_ptr, out_ptr,
    inter_dim, stride_xt, stride_ot,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """grid (T, cdiv(I, BLOCK)): out[t] = silu(x[t, :I]) * x[t, I:], rounding like the
    reference (silu in float32 rounded to the dtype, then the product rounded)."""
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter_dim
    row = x_ptr + tok * stride_xt
    g = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(row + inter_dim + offs, mask=mask, other=0.0)
    dtype = out_ptr.dtype.element_ty
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(out_ptr + tok * stride_ot + offs, (s * u.to(tl.float32)).to(dtype), mask=mask)
