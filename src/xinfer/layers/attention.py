"""Paged attention over the KV cache: stores this step's k/v, then attends with the metadata
of the forward context. The cache tensors are bound by the model runner (`bind_kv_cache`)."""

from __future__ import annotations

import torch
from torch import nn

from xinfer import kernels
from xinfer.runner.forward_context import get_forward_context


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.k_cache: torch.Tensor | None = None  # (num_blocks, block_size, Hk, D)
        self.v_cache: torch.Tensor | None = None

    def bind_kv_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (T, Hq, D), k/v (T, Hk, D) → (T, Hq*D)."""
        ctx = get_forward_context()
        if self.k_cache is None or self.v_cache is None:
            raise RuntimeError("KV cache is not bound; the model runner allocates it")
        kernels.store_kv(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        out = kernels.paged_attention(
            q,
            self.k_cache,
            self.v_cache,
            ctx.block_tables,
            ctx.seq_lens,
            ctx.query_start_loc,
            self.scale,
            max_query_len=ctx.max_query_len,
            max_seq_len=ctx.max_seq_len,
        )
        return out.reshape(q.shape[0], -1)
