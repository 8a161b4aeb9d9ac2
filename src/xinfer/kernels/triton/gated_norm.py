"""The two output gates of Qwen3-Next / Qwen3.5: the gated RMSNorm closing a Gated DeltaNet
layer (per value head: RMSNorm · weight · SiLU(z)) and the sigmoid gate on full attention's
output. One program per (token, head) row; HF's rounding steps are reproduced in order."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gated_rms_norm_kernel(
    x_ptr,  # (T, H, D), unit stride in D
    z_ptr,  # (T, H, D), unit stride in D
    w_ptr,  # (D,)
    out_ptr,  # (T, H, D) contiguous
    stride_xt,
    stride_xh,
    stride_zt,
    stride_zh,
    num_heads,
    head_dim,
    eps,
    BLOCK_D: tl.constexpr,
):
    t, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    mask = d < head_dim
    x = tl.load(x_ptr + t * stride_xt + h * stride_xh + d, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    normed = (xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / head_dim + eps)).to(x.dtype)
    w = tl.load(w_ptr + d, mask=mask, other=0.0)
    scaled = (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype)  # weight · x, as torch
    z = tl.load(z_ptr + t * stride_zt + h * stride_zh + d, mask=mask, other=0.0).to(tl.float32)
    out = scaled.to(tl.float32) * (z * tl.sigmoid(z))
    tl.store(out_ptr + (t * num_heads + h) * head_dim + d, out.to(x.dtype), mask=mask)


@triton.jit
def sigmoid_gate_mul_kernel(
    x_ptr,  # (T, H, D), unit stride in D
    gate_ptr,  # (T, H, D), unit stride in D
    out_ptr,  # (T, H, D) contiguous
    stride_xt,
    stride_xh,
    stride_gt,
    stride_gh,
    num_heads,
    head_dim,
    BLOCK_D: tl.constexpr,
):
    t, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    mask = d < head_dim
    x = tl.load(x_ptr + t * stride_xt + h * stride_xh + d, mask=mask, other=0.0)
    g = tl.load(gate_ptr + t * stride_gt + h * stride_gh + d, mask=mask, other=0.0)
    gate = tl.sigmoid(g.to(tl.float32)).to(x.dtype)  # torch.sigmoid rounds to the dtype
    out = x.to(tl.float32) * gate.to(tl.float32)
    tl.store(out_ptr + (t * num_heads + h) * head_dim + d, out.to(x.dtype), mask=mask)
