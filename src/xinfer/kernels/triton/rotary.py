"""Neox-style (rotate-half) RoPE: one program per token rotates all its q and k heads,
out of place, rounding like the reference (table cast to the activation dtype first)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    x_ptr,
    out_ptr,
    stride_h,
    num_heads,
    half,
    cos,
    sin,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """x (H, 2*half) at x_ptr with head stride `stride_h` → out (H, 2*half) contiguous."""
    dtype = x_ptr.dtype.element_ty
    # the reference multiplies by cos/sin already rounded to the activation dtype
    cos = cos.to(dtype).to(tl.float32)[None, :]
    sin = sin.to(dtype).to(tl.float32)[None, :]
    d = tl.arange(0, BLOCK_D)
    for h0 in range(0, num_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        mask = (h < num_heads)[:, None] & (d < half)[None, :]
        src = x_ptr + h[:, None] * stride_h + d[None, :]
        x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
        # each product and the sum are rounded separately, as torch does elementwise
        o1 = (x1 * cos).to(dtype).to(tl.float32) - (x2 * sin).to(dtype).to(tl.float32)
        o2 = (x2 * cos).to(dtype).to(tl.float32) + (x1 * sin).to(dtype).to(tl.float32)
        dst = out_ptr + h[:, None] * (2 * half) + d[None, :]
        tl.store(dst, o1.to(dtype), mask=mask)
        tl.store(dst + half, o2.to(dtype), mask=mask)


@triton.jit
def rope_kernel(
    q_ptr,
    k_ptr,
    q_out_ptr,  # (T, Hq, D) contiguous
    k_out_ptr,  # (T, Hk, D) contiguous
    positions_ptr,  # (T,)
    cos_sin_ptr,  # (max_pos, D) float32: [cos | sin]
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cs,
    num_q_heads,
    num_k_heads,
    half,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    cos = tl.load(cos_sin_ptr + pos * stride_cs + d, mask=d < half, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + half + d, mask=d < half, other=0.0)
    q_out = q_out_ptr + t * num_q_heads * 2 * half
    _rotate_heads(
        q_ptr + t * stride_qt, q_out, stride_qh, num_q_heads, half, cos, sin, BLOCK_H, BLOCK_D
    )
    k_out = k_out_ptr + t * num_k_heads * 2 * half
    _rotate_heads(
        k_ptr + t * stride_kt, k_out, stride_kh, num_k_heads, half, cos, sin, BLOCK_H, BLOCK_D
    )
