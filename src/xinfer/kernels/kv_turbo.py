"""The kernel entry points for a TurboQuant KV cache (`kv/turbo.py`), which
`xinfer.kernels` hands a `TurboKVCache` to: the rotations around the kernels in the model
dtype (`_rotate`: on CUDA a kernel whose row bits do not depend on the batch, not a cuBLAS
matmul; graph-capturable), the Triton kernels on CUDA, the twin elsewhere.

- store: k_rot = k R^T, v_rot = v R^T, then the turbo store kernel (codes and scales).
- qkv_prep: the fused norm + RoPE kernel writes k and v into a dense staging buffer (one
  block of one slot per token), then both are rotated in one launch and stored.
- attention: q_rot = q R^T, the paged kernels read the codes (`TURBO_BITS`), out = out_rot R.
  The long-prompt flash path (`attn_flash`) gets the sequence's blocks dequantized."""

from __future__ import annotations

import torch

from xinfer.kernels import reference
from xinfer.kv import turbo
from xinfer.kv.turbo import TurboKVCache


def _on_triton(t: torch.Tensor) -> bool:
    from xinfer.kernels import use_triton

    return use_triton(t)


def store_kv(k: torch.Tensor, v: torch.Tensor, cache: TurboKVCache, slots: torch.Tensor) -> None:
    """k, v (T, Hk, D), not rotated, into the cache at `slots` (T,); slots < 0 skipped."""
    if k.shape != v.shape or k.shape[1:] != (cache.num_kv_heads, cache.head_dim):
        raise ValueError(f"store_kv: k {tuple(k.shape)} does not fit the turbo cache's heads")
    if slots.shape != (k.shape[0],):
        raise ValueError("store_kv: slot_mapping must be (T,)")
    rot_t = cache.rotation.t()
    _store_rotated(_rotate(k, rot_t), _rotate(v, rot_t), cache, slots)


def _rotate(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """x (..., D) @ m (D, D) in m's dtype (the model's): `kv_turbo_launch.rotate` on CUDA (a
    row's bits independent of the other rows), a matmul elsewhere (the twin)."""
    x = x.to(m.dtype)
    if _on_triton(x):
        from xinfer.kernels import kv_turbo_launch

        return kv_turbo_launch.rotate(x, m)
    return x @ m


def _store_rotated(
    k_rot: torch.Tensor, v_rot: torch.Tensor, cache: TurboKVCache, slots: torch.Tensor
) -> None:
    """Rotated k, v (T, Hk, D) quantized into the cache: the store kernel, or its twin."""
    if _on_triton(k_rot):
        from xinfer.kernels import kv_turbo_launch

        return kv_turbo_launch.store(k_rot, v_rot, cache, slots)
    turbo.store(k_rot, v_rot, cache, slots)


def qkv_prep(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    cache: TurboKVCache,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
) -> torch.Tensor:
    """`kernels.qkv_prep` for a turbo cache: the roped q (T, Hq, D), NOT rotated by R
    (`paged_attention` does that); k and v quantized into the cache."""
    from xinfer import kernels

    num_tokens = k.shape[0]
    staging = k.new_empty((2, num_tokens, 1, *k.shape[1:]))  # (K|V, T slots, 1, Hk, D)
    every = torch.arange(num_tokens, device=k.device)
    q_out = kernels.qkv_prep(
        q, k, v, positions, cos_sin_cache, staging[0], staging[1], every,
        q_norm_weight, k_norm_weight, eps,
    )  # fmt: skip
    rot = cache.rotation
    kv_rot = _rotate(staging[:, :, 0], rot.t())  # K and V rotated in one launch
    _store_rotated(kv_rot[0], kv_rot[1], cache, slot_mapping)
    return q_out


def paged_attention(
    q: torch.Tensor,
    cache: TurboKVCache,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """`kernels.paged_attention` on a turbo cache: q (T, Hq, D) → (T, Hq, D) in q's dtype."""
    if q.dim() != 3 or q.shape[2] != cache.head_dim or q.shape[1] % cache.num_kv_heads:
        raise ValueError(f"paged_attention: q {tuple(q.shape)} does not fit the turbo cache")
    rot = cache.rotation
    q_rot = _rotate(q, rot.t())  # (T, Hq, D)
    if _on_triton(q):
        from xinfer.kernels import attn_flash, attn_launch

        if attn_flash.wanted(
            q_rot, q_rot, block_tables, max_query_len, max_seq_len, sliding_window
        ):  # the dense blocks come out in q's dtype, as flash wants them
            k, v, table = turbo.dense_blocks(cache, block_tables, [max_seq_len], q_rot.dtype)
            out_rot = attn_flash.prefill_one_sequence(q_rot, k, v, table[0], max_seq_len, scale)
        else:
            out_rot = attn_launch.paged_attention(
                q_rot, cache.k_codes, cache.v_codes, block_tables, seq_lens, query_start_loc,
                scale, max_query_len=max_query_len, max_seq_len=max_seq_len,
                sliding_window=sliding_window, turbo=cache,
            )  # fmt: skip
    else:
        k, v, tables = turbo.dense_blocks(cache, block_tables, seq_lens.tolist(), torch.float32)
        out_rot = reference.paged_attention(
            q_rot, k, v, tables, seq_lens, query_start_loc, scale, sliding_window
        )
    return _rotate(out_rot, rot).to(q.dtype)
