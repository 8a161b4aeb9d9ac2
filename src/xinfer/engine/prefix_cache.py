"""Automatic prefix caching: every full KV block that has been computed is named by a hash
chained over the tokens before it (the hash of its parent block, its own tokens, and any
extra key that changes KV content), so a later request whose prompt starts with the same
tokens finds those blocks and skips computing them. This module holds the hash → block map
and the hit counters; `kv_cache.BlockAllocator` owns the blocks, their reference counts
and the LRU order in which unreferenced cached blocks are evicted."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

# The parent of a request's first block. Anything that changed the KV of every block
# (a model, a KV dtype) is the same for the whole engine, so it need not enter the hash.
ROOT_HASH = b"xinfer-prefix-cache-v1"


def block_hash(parent: bytes, token_ids: Sequence[int], extra: bytes = b"") -> bytes:
    """SHA-256 of the parent's hash, the block's tokens and `extra` (collision-safe: a
    false hit would silently give another prompt's keys and values)."""
    h = hashlib.sha256(parent)
    h.update(array("q", token_ids).tobytes())
    h.update(extra)
    return h.digest()


def chain_hashes(
    token_ids: Sequence[int], block_size: int, hashes: list[bytes], num_blocks: int
) -> list[bytes]:
    """Extend `hashes` (those of the first blocks, in place) to the first `num_blocks` full
    blocks of `token_ids`; returns it."""
    for i in range(len(hashes), num_blocks):
        parent = hashes[-1] if hashes else ROOT_HASH
        hashes.append(block_hash(parent, token_ids[i * block_size : (i + 1) * block_size]))
    return hashes


@dataclass
class PrefixCacheStats:
    """Token counts since start (or the last reset), as vLLM's `prefix_cache_*` metrics:
    `queries`: prompt tokens looked up; `hits`: those found computed in the cache."""

    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class PrefixCache:
    """The hash → block map of computed full blocks (referenced or not)."""

    def __init__(self) -> None:
        self._block_of: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        self.stats = PrefixCacheStats()

    @property
    def num_blocks(self) -> int:
        """Blocks with a cached content (held by requests or evictable)."""
        return len(self._block_of)

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._hash_of

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """The blocks of the longest cached run of `hashes` from the first."""
        blocks: list[int] = []
        for h in hashes:
            block = self._block_of.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def insert(self, block_id: int, h: bytes) -> bool:
        """Name a freshly computed block; False when another block already holds that
        content (two requests computed it at once): this one then stays private."""
        if h in self._block_of or block_id in self._hash_of:
            return False
        self._block_of[h] = block_id
        self._hash_of[block_id] = h
        return True

    def forget(self, block_id: int) -> None:
        """The block is being reused for other content (evicted)."""
        h = self._hash_of.pop(block_id, None)
        if h is not None:
            del self._block_of[h]

    def clear(self) -> None:
        self._block_of.clear()
        self._hash_of.clear()
