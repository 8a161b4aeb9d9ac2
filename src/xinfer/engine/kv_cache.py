"""Paged KV cache bookkeeping: fixed-size blocks with reference counts. A block is used by
the requests that reference it; with prefix caching, a computed full block that no request
references any more stays cached (its content reusable) in LRU order until a new block is
needed and nothing uncached is free. The cache tensors themselves are allocated by the
model runner, one (num_blocks, block_size, Hk, D) pair per attention layer."""

from __future__ import annotations

from collections import OrderedDict

from xinfer.engine.prefix_cache import PrefixCache, PrefixCacheStats


class BlockAllocator:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False
    ) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives low ids first
        self._ref_count = [0] * num_blocks
        # Cached blocks no request references, least recently released first.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.prefix_cache = PrefixCache() if enable_prefix_caching else None

    @property
    def num_free(self) -> int:
        """Blocks a request can get now (cached but unreferenced ones count: evictable)."""
        return len(self._free) + len(self._evictable)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def ref_count(self, block_id: int) -> int:
        return self._ref_count[block_id]

    def allocate(self, n: int) -> list[int]:
        """`n` blocks for new content: uncached free blocks first, then the least recently
        released cached ones (their cache entries are dropped)."""
        if n > self.num_free:
            raise RuntimeError(f"KV cache has {self.num_free} free blocks, {n} requested")
        blocks = []
        for _ in range(n):
            if self._free:
                block = self._free.pop()
            else:
                block, _ = self._evictable.popitem(last=False)
                self.prefix_cache.forget(block)
            self._ref_count[block] = 1
            blocks.append(block)
        return blocks

    def share(self, blocks: list[int]) -> None:
        """Reference cached blocks found by a prefix lookup (they stop being evictable)."""
        for block in blocks:
            if self._ref_count[block] == 0:
                del self._evictable[block]
            self._ref_count[block] += 1

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block. Released from the last to the first, so that a
        request's tail is evicted before its prefix, which other prompts share more often."""
        for block in reversed(blocks):
            self._ref_count[block] -= 1
            if self._ref_count[block] > 0:
                continue
            if self.prefix_cache is not None and self.prefix_cache.is_cached(block):
                self._evictable[block] = None
            else:
                self._free.append(block)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that no request references, and the hit counters
        (start-up warm-ups are not the user's traffic)."""
        if self.prefix_cache is None:
            return
        self.prefix_cache.stats = PrefixCacheStats()
        for block in self._evictable:
            self.prefix_cache.forget(block)
            self._free.append(block)
        self._evictable.clear()
