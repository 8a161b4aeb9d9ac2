"""Paged attention over the KV cache, in two steps: `prepare_qkv` normalises and rotates q
and k and stores k/v at this step's slots (one fused kernel), then `forward` attends with the
metadata of the forward context. The caches are bound by the model runner (`bind_kv_cache`)."""

from __future__ import annotations

import torch
from torch import nn

from xinfer import kernels
from xinfer.kv.turbo import TurboKVCache
from xinfer.layers.norm import RMSNorm
from xinfer.runner.forward_context import get_forward_context


class PagedAttention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.sliding_window = sliding_window  # keys within the last W positions only
        # (num_blocks, block_size, Hk, D) each, or a TurboKVCache holding both (v_cache None)
        self.k_cache: torch.Tensor | TurboKVCache | None = None
        self.v_cache: torch.Tensor | None = None

    def bind_kv_cache(
        self, k_cache: torch.Tensor | TurboKVCache, v_cache: torch.Tensor | None = None
    ) -> None:
        """Two tensors, or one `TurboKVCache` (kv/turbo.py) for K and V."""
        if isinstance(k_cache, TurboKVCache) != (v_cache is None):
            raise ValueError("bind_kv_cache: a K and a V tensor, or one TurboKVCache")
        self.k_cache, self.v_cache = k_cache, v_cache

    def _caches(self) -> tuple[torch.Tensor | TurboKVCache, torch.Tensor | None]:
        if self.k_cache is None:
            raise RuntimeError("KV cache is not bound; the model runner allocates it")
        return self.k_cache, self.v_cache

    def prepare_qkv(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> torch.Tensor:
        """q (T, Hq, D), k/v (T, Hk, D), views of the qkv projection allowed. Applies the
        per-head norms when given (Qwen3), RoPE from `cos_sin_cache`, stores k/v in the cache
        and returns the rotated q (T, Hq, D) for `forward`."""
        norm: dict = {}
        if q_norm is not None or k_norm is not None:
            if q_norm is None or k_norm is None or q_norm.eps != k_norm.eps:
                raise ValueError("prepare_qkv: per-head norms come in pairs with one eps")
            norm = dict(q_norm_weight=q_norm.weight, k_norm_weight=k_norm.weight, eps=q_norm.eps)
        k_cache, v_cache = self._caches()
        slots = get_forward_context().slot_mapping
        return kernels.qkv_prep(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slots, **norm)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """q (T, Hq, D) from `prepare_qkv`, whose k/v are in the cache → (T, Hq*D)."""
        ctx = get_forward_context()
        k_cache, v_cache = self._caches()
        out = kernels.paged_attention(
            q,
            k_cache,
            v_cache,
            ctx.block_tables,
            ctx.seq_lens,
            ctx.query_start_loc,
            self.scale,
            max_query_len=ctx.max_query_len,
            max_seq_len=ctx.max_seq_len,
            sliding_window=self.sliding_window,
        )
        return out.reshape(q.shape[0], -1)
