"""Triton launchers of the TurboQuant KV cache: the store (`triton/kv_turbo.py`: shape, dtype
and layout checks, then one program per (token, KV head)) and the rotations
(`triton/rotate.py`: rows times R or R^T with the same tiles whatever the row count, so a
row's bits do not depend on the batch). `kernels/kv_turbo.py` calls them on CUDA; they also
run on CPU tensors under `TRITON_INTERPRET=1` (the interpreter tests)."""

from __future__ import annotations

import torch
import triton

from xinfer.kernels import pdl
from xinfer.kernels.triton.kv_turbo import turbo_store_kernel
from xinfer.kernels.triton.rotate import BLOCK_R, rotate_rows_kernel
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


def rotate(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """x (..., D) @ m (D, D) in x's dtype, float32 accumulation; m may be a transposed view
    (R.t()). x and m share a float dtype."""
    d = m.shape[0]
    if m.shape != (d, d) or x.shape[-1] != d or d > 256:
        raise ValueError(f"rotate: x {tuple(x.shape)} and m {tuple(m.shape)} do not fit")
    if x.dtype != m.dtype:
        raise ValueError(f"rotate: x is {x.dtype}, the rotation {m.dtype}")
    x2 = x.reshape(-1, d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows:
        block_n = min(64, triton.next_power_of_2(d))
        rotate_rows_kernel[(triton.cdiv(rows, BLOCK_R.value), triton.cdiv(d, block_n))](
            x2, m, out, rows, x2.stride(0), m.stride(0), m.stride(1), d,
            D=d, BLOCK_N=block_n, BLOCK_K=min(64, triton.next_power_of_2(d)),
            DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            num_warps=4, **pdl.options(x),
        )  # fmt: skip
    return out
