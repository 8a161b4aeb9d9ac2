"""A paged-attention case for the kernel tests: random K/V caches in shuffled blocks, the
block tables, queries and the (seq_lens, query_start_loc) of a batch."""

from __future__ import annotations

import torch


def paged_case(dtype, seq_lens, query_lens=None, hq=4, hk=2, head_dim=32, block_size=16, seed=0):
    """(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc); `query_lens` None: one
    query a sequence (decode)."""
    query_lens = [1] * len(seq_lens) if query_lens is None else query_lens
    g = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-s // block_size) for s in seq_lens) + 1
    num_blocks = len(seq_lens) * max_blocks + 3
    k_cache = torch.randn(num_blocks, block_size, hk, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, hk, head_dim, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)[: len(seq_lens) * max_blocks]
    block_tables = perm.view(len(seq_lens), max_blocks).to(torch.int32)
    q = torch.randn(sum(query_lens), hq, head_dim, generator=g).to(dtype)
    qsl = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    return q, k_cache, v_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32), qsl
