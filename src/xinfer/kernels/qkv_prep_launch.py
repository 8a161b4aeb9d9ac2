"""Triton launcher for the fused qkv preparation (per-head RMSNorm, RoPE, KV-cache store):
pointer layout, dtype checks and grid. `xinfer.kernels.qkv_prep` calls it on CUDA; it also
runs on CPU tensors under `TRITON_INTERPRET=1` (the interpreter tests)."""

from __future__ import annotations

import torch
import triton

from xinfer.kernels import pdl, reference
from xinfer.kernels.triton.qkv_prep import qkv_prep_kernel


def _fusable(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    norm_weights: list[torch.Tensor],
) -> bool:
    """Whether the kernel reproduces the reference: one activation dtype (which the norm
    weights do not promote), a float32 table and an even rotary width."""
    if not q.dtype == k.dtype == v.dtype or cos_sin_cache.dtype != torch.float32:
        return False
    return cos_sin_cache.shape[-1] % 2 == 0 and all(
        torch.promote_types(w.dtype, q.dtype) == q.dtype for w in norm_weights
    )


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def qkv_prep(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
) -> torch.Tensor:
    """Returns the roped q (T, Hq, D) contiguous; k/v go into the caches in place (slots < 0
    are skipped). q/k/v may be strided views (heads of the qkv projection output)."""
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("qkv_prep: the KV caches must be contiguous in head_dim")
    norm_weights = [w for w in (q_norm_weight, k_norm_weight) if w is not None]
    if not _fusable(q, k, v, cos_sin_cache, norm_weights):
        return reference.qkv_prep(
            q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
            q_norm_weight, k_norm_weight, eps,
        )  # fmt: skip
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    num_tokens, num_q_heads, head_dim = q.shape
    if num_tokens == 0:
        return q_out
    q_w, k_w = (w.contiguous() for w in norm_weights) if norm_weights else (q_out, q_out)
    cos_sin_cache = cos_sin_cache.contiguous()
    block_d = triton.next_power_of_2(head_dim)
    rot_half = cos_sin_cache.shape[-1] // 2  # < head_dim // 2: partial rotary
    qkv_prep_kernel[(num_tokens, num_q_heads + k.shape[1])](
        q, k, v, q_out, k_cache, v_cache, positions, cos_sin_cache, slot_mapping, q_w, k_w,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos_sin_cache.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3], num_q_heads,
        head_dim, rot_half, k_cache.shape[1], eps,
        HAS_NORM=bool(norm_weights), BLOCK_D=block_d,
        BLOCK_HALF=max(1, triton.next_power_of_2(rot_half)),
        FP8_MAX=float(torch.finfo(k_cache.dtype).max) if k_cache.element_size() == 1 else 0.0,
        num_warps=max(1, min(16, block_d // 256)),  # rms_norm's choice: same sum order
        **pdl.options(q),
    )  # fmt: skip
    return q_out
