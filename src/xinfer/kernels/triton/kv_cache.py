"""Scatter this step's k and v (T, Hk, D) into the paged caches (num_blocks, block_size,
Hk, D): one program per token; tokens whose slot is negative (padding) write nothing."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,  # (T,) flat slot = block_id * block_size + offset
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kc_b,
    stride_kc_s,
    stride_kc_h,
    stride_vc_b,
    stride_vc_s,
    stride_vc_h,
    num_heads,
    head_dim,
    block_size,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8_MAX: tl.constexpr,  # > 0: an fp8 cache; saturate to ±FP8_MAX instead of overflowing
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    blk, off = slot // block_size, slot % block_size
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_heads) & (d < head_dim)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    if FP8_MAX > 0:
        k = tl.minimum(tl.maximum(k.to(tl.float32), -FP8_MAX), FP8_MAX)
        v = tl.minimum(tl.maximum(v.to(tl.float32), -FP8_MAX), FP8_MAX)
    k_dst = k_cache_ptr + blk * stride_kc_b + off * stride_kc_s + h * stride_kc_h + d
    v_dst = v_cache_ptr + blk * stride_vc_b + off * stride_vc_s + h * stride_vc_h + d
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)
