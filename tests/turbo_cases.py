"""TurboQuant KV-cache cases for the kernel tests: a paged case (tests/paged_cases.py) whose
K/V are stored into a `TurboKVCache` by the twin, and that cache dequantized back to dense
rotated K/V, which `reference.paged_attention` reads as the kernels' expected result."""

from __future__ import annotations

import torch
from paged_cases import paged_case

from xinfer.kv import turbo
from xinfer.kv.format import TurboQuant


def turbo_cache(k: torch.Tensor, v: torch.Tensor, bits: int, dtype: torch.dtype):
    """A cache (num_blocks, block_size, Hk, D) holding rotated k, v of that shape (stored
    by the twin at every slot) and its dequantized dense K, V (float32)."""
    num_blocks, block_size, hk, head_dim = k.shape
    cache = turbo.allocate(TurboQuant(bits), num_blocks, block_size, hk, head_dim, dtype, k.device)
    slots = torch.arange(num_blocks * block_size, device=k.device)
    turbo.store(k.flatten(0, 1), v.flatten(0, 1), cache, slots)
    dense_k = turbo.dequantize(cache.k_codes, cache.k_scales, cache.centroids, bits)
    dense_v = turbo.dequantize(cache.v_codes, cache.v_scales, cache.centroids, bits)
    return cache, dense_k, dense_v


def turbo_paged_case(dtype, seq_lens, query_lens=None, hq=4, hk=2, head_dim=32, bits=4,
                     block_size=16, seed=0, device="cpu"):  # fmt: skip
    """(q, cache, block_tables, seq_lens, query_start_loc) and the dense (K, V) float32."""
    q, k, v, tables, lens, qsl = paged_case(
        dtype, seq_lens, query_lens, hq, hk, head_dim, block_size, seed
    )
    cache, dense_k, dense_v = turbo_cache(k.to(device), v.to(device), bits, dtype)
    dev = [t.to(device) for t in (q, tables, lens, qsl)]
    return (dev[0], cache, *dev[1:]), (dense_k, dense_v)
