"""Everything between the qkv projection and paged attention in one launch: optional per-head
RMSNorm of q and k (Qwen3's qk-norm), neox RoPE, q written out contiguous, and the roped k
plus v scattered into the paged KV cache. One program per (token, head): the q heads first,
then the KV heads, which also move v; a KV head whose slot is negative (padding) writes
nothing. Partial rotary (a cos/sin table narrower than the head) rotates the first dims and
passes the rest through (normalised when the norm is on). The arithmetic is that of the
separate kernels, step by step: the norm as `norm.py`, the rotation as `rotary.py`, the
cache store (fp8: saturating) as `kv_cache.py`."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.pdl import wait_for_producers


@triton.jit
def _norm_rope(
    x_ptr,
    w_ptr,
    cos,
    sin,
    head_dim,
    rot_half,
    eps,
    HAS_NORM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """One head at x_ptr → its rotated halves (dims [0, 2·rot_half)) and the pass-through
    tail (dims [2·rot_half, head_dim), partial rotary; masked to nothing otherwise), rounded
    to x's dtype; cos/sin are float32."""
    dtype = x_ptr.dtype.element_ty
    d = tl.arange(0, BLOCK_HALF)
    mask = d < rot_half
    cols = tl.arange(0, BLOCK_D)
    tail_mask = (cols >= 2 * rot_half) & (cols < head_dim)
    x1 = tl.load(x_ptr + d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + rot_half + d, mask=mask, other=0.0).to(tl.float32)
    tail = tl.load(x_ptr + cols, mask=tail_mask, other=0.0).to(tl.float32)
    if HAS_NORM:  # as norm.py: float32 statistics over the whole head, two roundings
        xf = tl.load(x_ptr + cols, mask=cols < head_dim, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / head_dim + eps)
        w1 = tl.load(w_ptr + d, mask=mask, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + rot_half + d, mask=mask, other=0.0).to(tl.float32)
        wt = tl.load(w_ptr + cols, mask=tail_mask, other=0.0).to(tl.float32)
        x1 = ((x1 * rstd).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        x2 = ((x2 * rstd).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
        tail = (tail * rstd).to(dtype).to(tl.float32) * wt
    # as rotary.py: each product and the sum rounded separately, as torch does elementwise
    o1 = (x1 * cos).to(dtype).to(tl.float32) - (x2 * sin).to(dtype).to(tl.float32)
    o2 = (x2 * cos).to(dtype).to(tl.float32) + (x1 * sin).to(dtype).to(tl.float32)
    return o1.to(dtype), o2.to(dtype), tail.to(dtype)


@triton.jit
def _to_cache(x, cache_ptr, FP8_MAX: tl.constexpr):
    """x in the cache's dtype; an fp8 cache (FP8_MAX > 0) saturates instead of overflowing."""
    if FP8_MAX > 0:
        x = tl.minimum(tl.maximum(x.to(tl.float32), -FP8_MAX), FP8_MAX)
    return x.to(cache_ptr.dtype.element_ty)


@triton.jit
def qkv_prep_kernel(
    q_ptr,  # (T, Hq, D), unit stride in D
    k_ptr,  # (T, Hk, D), unit stride in D
    v_ptr,  # (T, Hk, D), unit stride in D
    q_out_ptr,  # (T, Hq, D) contiguous
    k_cache_ptr,  # (num_blocks, block_size, Hk, D)
    v_cache_ptr,
    positions_ptr,  # (T,)
    cos_sin_ptr,  # (max_pos, D) float32: [cos | sin]
    slot_mapping_ptr,  # (T,) flat slot = block_id * block_size + offset; < 0: padding
    q_w_ptr,  # (D,) q-norm weight, read only with HAS_NORM
    k_w_ptr,  # (D,) k-norm weight, read only with HAS_NORM
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cs,
    stride_kc_b,
    stride_kc_s,
    stride_kc_h,
    stride_vc_b,
    stride_vc_s,
    stride_vc_h,
    num_q_heads,
    head_dim,
    rot_half,  # half the rotary dims (head_dim // 2 unless partial rotary)
    block_size,
    eps,
    HAS_NORM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    FP8_MAX: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    wait_for_producers(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    dtype = q_ptr.dtype.element_ty
    half = rot_half
    d = tl.arange(0, BLOCK_HALF)
    cols = tl.arange(0, BLOCK_D)
    tail_mask = (cols >= 2 * half) & (cols < head_dim)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    # the reference multiplies by cos/sin already rounded to the activation dtype
    cos = tl.load(cos_sin_ptr + pos * stride_cs + d, mask=d < half, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + half + d, mask=d < half, other=0.0)
    cos, sin = cos.to(dtype).to(tl.float32), sin.to(dtype).to(tl.float32)
    if h < num_q_heads:
        x = q_ptr + t * stride_qt + h * stride_qh
        o1, o2, tail = _norm_rope(
            x, q_w_ptr, cos, sin, head_dim, half, eps, HAS_NORM, BLOCK_D, BLOCK_HALF
        )
        dst = q_out_ptr + (t * num_q_heads + h) * head_dim
        tl.store(dst + d, o1, mask=d < half)
        tl.store(dst + half + d, o2, mask=d < half)
        tl.store(dst + cols, tail, mask=tail_mask)
    else:
        slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
        if slot >= 0:
            hk = h - num_q_heads
            blk, off = slot // block_size, slot % block_size
            x = k_ptr + t * stride_kt + hk * stride_kh
            o1, o2, tail = _norm_rope(
                x, k_w_ptr, cos, sin, head_dim, half, eps, HAS_NORM, BLOCK_D, BLOCK_HALF
            )
            dst = k_cache_ptr + blk * stride_kc_b + off * stride_kc_s + hk * stride_kc_h
            tl.store(dst + d, _to_cache(o1, k_cache_ptr, FP8_MAX), mask=d < half)
            tl.store(dst + half + d, _to_cache(o2, k_cache_ptr, FP8_MAX), mask=d < half)
            tl.store(dst + cols, _to_cache(tail, k_cache_ptr, FP8_MAX), mask=tail_mask)
            v = tl.load(v_ptr + t * stride_vt + hk * stride_vh + cols, mask=cols < head_dim)
            dst = v_cache_ptr + blk * stride_vc_b + off * stride_vc_s + hk * stride_vc_h + cols
            tl.store(dst, _to_cache(v, v_cache_ptr, FP8_MAX), mask=cols < head_dim)
