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


@triton.jit
def sigmoid_gated_add_kernel(
    base_ptr, gate_ptr, gate_w_ptr, x_ptr, out_ptr,
    n_cols, gate_k, stride_bt, stride_gt, stride_xt, stride_ot,
    BLOCK: tl.constexpr, GATE_DOT: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """grid (T, cdiv(H, BLOCK)): out[t] = base[t] + sigmoid(gate[t, 0]) * x[t], rounding like
    the reference's three ops (sigmoid rounded to the dtype, the product rounded, the sum
    rounded; launched without FMA contraction): a MoE block's routed output plus its gated
    shared expert in one pass. Triton's sigmoid (its exp and divide) may differ from torch's
    in the last float32 ulp, so a rounded sigmoid can rarely differ by one ulp of the dtype;
    every path of the engine runs this kernel, so its bits are the same on all of them.
    GATE_DOT: the gate is the gate linear's output, computed here (one launch fewer a MoE
    layer): gate_ptr holds its input (T, gate_k) and gate_w_ptr its (1, gate_k) weight; the
    dot sums in float32 in BLOCK_K chunks, in a fixed order per row whatever T, and rounds to
    the dtype as a linear's output does (its bits are this kernel's, not cuBLAS's)."""
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    dtype = out_ptr.dtype.element_ty
    if GATE_DOT:
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, gate_k, BLOCK_K):
            mask_k = offs_k < gate_k - k0
            a = tl.load(gate_ptr + tok * stride_gt + k0 + offs_k, mask=mask_k, other=0.0)
            w = tl.load(gate_w_ptr + k0 + offs_k, mask=mask_k, other=0.0)
            acc += a.to(tl.float32) * w.to(tl.float32)
        g = tl.sum(acc, axis=0).to(dtype).to(tl.float32)
    else:
        g = tl.load(gate_ptr + tok * stride_gt).to(tl.float32)
    s = tl.sigmoid(g).to(dtype).to(tl.float32)  # torch.sigmoid rounds to the dtype
    x = tl.load(x_ptr + tok * stride_xt + offs, mask=mask, other=0.0).to(tl.float32)
    base = tl.load(base_ptr + tok * stride_bt + offs, mask=mask, other=0.0).to(tl.float32)
    prod = (s * x).to(dtype).to(tl.float32)
    tl.store(out_ptr + tok * stride_ot + offs, (base + prod).to(dtype), mask=mask)
