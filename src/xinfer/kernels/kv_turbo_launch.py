"""Triton launcher of the TurboQuant KV store (`triton/kv_turbo.py`): shape, dtype and
layout checks, then one program per (token, KV head). `kernels/kv_turbo.py` calls it on
CUDA; it also runs on CPU tensors under `TRITON_INTERPRET=1` (the interpreter tests)."""

from __future__ import annotations

import torch
import triton

from xinfer.kernels.triton.kv_turbo import turbo_store_kernel
from xinfer.kv.turbo import TurboKVCache


def check_cache(cache: TurboKVCache) -> None:
    """The layout the kernels assume: contiguous codes and scales of matching shapes."""
    width = cache.bits * cache.head_dim // 8
    for codes, scales in ((cache.k_codes, cache.k_scales), (cache.v_codes, cache.v_scales)):
        if codes.dtype != torch.uint8 or scales.dtype != torch.float16:
            raise ValueError("turbo cache: codes must be uint8 and scales float16")
        if codes.shape[-1] != width or codes.shape[:3] != scales.shape:
            raise ValueError(f"turbo cache: codes {tuple(codes.shape)}, scales disagree")
        if not codes.is_contiguous() or not scales.is_contiguous():
            raise ValueError("turbo cache: codes and scales must be contiguous")
    if cache.k_codes.shape != cache.v_codes.shape:
        raise ValueError("turbo cache: K and V codes differ in shape")


def store(
    k_rot: torch.Tensor, v_rot: torch.Tensor, cache: TurboKVCache, slot_mapping: torch.Tensor
) -> None:
    """Rotated k, v (T, Hk, D) quantized into `cache` in place; slots < 0 are skipped."""
    check_cache(cache)
    num_tokens, num_heads, head_dim = k_rot.shape
    if v_rot.shape != k_rot.shape or (num_heads, head_dim) != (cache.num_kv_heads, cache.head_dim):
        raise ValueError(f"turbo store: k {tuple(k_rot.shape)} does not fit the cache")
    if slot_mapping.shape != (num_tokens,):
        raise ValueError("turbo store: slot_mapping must be (T,)")
    if num_tokens == 0:
        return
    k_rot = k_rot if k_rot.stride(-1) == 1 else k_rot.contiguous()
    v_rot = v_rot if v_rot.stride(-1) == 1 else v_rot.contiguous()
    turbo_store_kernel[(num_tokens, num_heads)](
        k_rot, v_rot, *cache.tensors(), cache.centroids, cache.boundaries, slot_mapping,
        k_rot.stride(0), k_rot.stride(1), v_rot.stride(0), v_rot.stride(1),
        HEAD_DIM=head_dim, BITS=cache.bits, BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=1 if head_dim <= 128 else 2,
    )  # fmt: skip
