"""Prefix caching bookkeeping: chained block hashes, reference counts, LRU eviction of
unreferenced cached blocks (a request's tail before its prefix), the last-token rule, hit
counters, and a random sequence of admissions, steps, aborts and preemptions that keeps
every invariant."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from xinfer.config import SchedulerConfig
from xinfer.engine.kv_cache import BlockAllocator
from xinfer.engine.prefix_cache import ROOT_HASH, block_hash, chain_hashes
from xinfer.engine.request import Request, RequestStatus
from xinfer.engine.scheduler import Scheduler
from xinfer.sampling import SamplingParams


def test_hash_chains_over_the_prefix():
    a = chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, [], 2)
    b = chain_hashes([9, 9, 9, 9, 5, 6, 7, 8], 4, [], 2)
    assert a[0] != b[0] and a[1] != b[1]  # same block tokens, different prefix
    assert a[0] == block_hash(ROOT_HASH, [1, 2, 3, 4])
    assert chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, a[:1], 2) == a  # extends in place
    assert block_hash(ROOT_HASH, [1, 2, 3, 4], b"salt") != a[0]
    assert block_hash(ROOT_HASH, [1 << 40]) != block_hash(ROOT_HASH, [0])


def test_allocator_refcounts_and_lru_eviction():
    alloc = BlockAllocator(num_blocks=4, block_size=2, enable_prefix_caching=True)
    cache = alloc.prefix_cache
    first = alloc.allocate(3)
    for i, block in enumerate(first):
        assert cache.insert(block, bytes([i]))
    assert not cache.insert(first[0], b"other")  # a block holds one content
    assert not cache.insert(3, bytes([0]))  # a content lives in one block
    alloc.share(first[:2])  # a second request shares the prefix
    alloc.free(first)
    assert [alloc.ref_count(b) for b in first] == [1, 1, 0]
    assert alloc.num_free == 2  # one uncached free block and one evictable
    alloc.free(first[:2])
    assert alloc.num_free == 4 and alloc.usage == 0.0
    assert cache.lookup([bytes([0]), bytes([1]), bytes([2])]) == first
    # Uncached blocks go first; then the tail of the last freed request, then its prefix.
    assert alloc.allocate(1) == [3]
    assert alloc.allocate(1) == [first[2]]
    assert cache.lookup([bytes([0]), bytes([1]), bytes([2])]) == first[:2]
    alloc.share([first[0]])  # a hit protects a block from eviction
    assert alloc.allocate(1) == [first[1]]
    assert cache.lookup([bytes([0]), bytes([1])]) == [first[0]]
    assert alloc.num_free == 0


def test_reset_forgets_unreferenced_blocks_and_counts():
    alloc = BlockAllocator(num_blocks=3, block_size=2, enable_prefix_caching=True)
    blocks = alloc.allocate(2)
    alloc.prefix_cache.insert(blocks[0], b"kept")
    alloc.prefix_cache.insert(blocks[1], b"gone")
    alloc.prefix_cache.stats.queries = 5
    alloc.free(blocks[1:])
    alloc.reset_prefix_cache()
    assert alloc.prefix_cache.lookup([b"kept"]) == [blocks[0]]  # still referenced
    assert alloc.prefix_cache.lookup([b"gone"]) == []
    assert alloc.prefix_cache.stats.queries == 0 and alloc.num_free == 2


def _step(sched: Scheduler, kv: dict | None = None) -> list:
    """One scheduler step as the engine runs it, with a sampled token of 7 appended. `kv`
    (block → slot → what was computed there) records each written slot as the tokens up to
    its position, which is what a real K/V entry depends on."""
    out = sched.schedule()
    bs = sched.allocator.block_size
    for s in out.scheduled:
        req = s.request
        if kv is not None:
            tokens = req.all_token_ids
            for p in range(s.start, s.start + s.num_new_tokens):
                kv.setdefault(req.block_ids[p // bs], {})[p % bs] = tuple(tokens[: p + 1])
        req.num_computed_tokens += s.num_new_tokens
        sched.cache_computed_blocks(req)
        if s.samples:
            req.output_token_ids.append(7)
    return out.scheduled


def test_a_fully_cached_prompt_still_computes_its_last_token():
    alloc = BlockAllocator(num_blocks=16, block_size=4, enable_prefix_caching=True)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), alloc)
    prompt = list(range(12))  # exactly three blocks
    first = Request("a", prompt, SamplingParams())
    sched.add(first)
    _step(sched)
    assert first.num_cached_blocks == 3
    second = Request("b", prompt, SamplingParams())
    sched.add(second)
    [_, s] = _step(sched)
    assert (s.start, s.num_new_tokens, s.samples) == (8, 4, True)  # the last block again
    assert second.block_ids[:2] == first.block_ids[:2]
    assert second.block_ids[2] != first.block_ids[2]
    assert second.num_cached_tokens == 8
    assert alloc.prefix_cache.stats.queries == 24 and alloc.prefix_cache.stats.hits == 8


def test_hits_are_given_back_when_the_rest_does_not_fit():
    alloc = BlockAllocator(num_blocks=4, block_size=4, enable_prefix_caching=True)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), alloc)
    first = Request("a", list(range(8)) + [50], SamplingParams())  # 3 blocks
    sched.add(first)
    _step(sched)
    long = Request("b", list(range(8)) + list(range(100, 120)), SamplingParams())
    sched.add(long)  # its prefix hits 2 blocks but it needs 5 more: does not fit
    assert [s.request.request_id for s in _step(sched)] == ["a"]
    assert long.block_ids == [] and long.num_computed_tokens == 0
    assert [alloc.ref_count(b) for b in first.block_ids] == [1, 1, 1]
    assert alloc.prefix_cache.stats.queries == 9  # the failed admission counts nothing


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_traffic_keeps_the_invariants(seed):
    """Requests sharing prefixes arrive, run, are aborted and preempted at random. After
    every step each request's computed positions hold exactly its own tokens' K/V (so no
    hit gave wrong content and no shared block was overwritten), reference counts equal the
    holders, and free blocks are exactly the unheld ones; at the end every block is free."""
    rng = random.Random(seed)
    bs = 4
    alloc = BlockAllocator(num_blocks=rng.randrange(12, 40), block_size=bs,
                           enable_prefix_caching=True)  # fmt: skip
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=rng.randrange(1, 6), max_num_batched_tokens=16), alloc
    )
    stems = [[rng.randrange(50) for _ in range(rng.randrange(1, 24))] for _ in range(3)]
    live: list[Request] = []
    kv: dict[int, dict[int, tuple]] = {}
    hits = 0
    for step in range(60):
        if rng.random() < 0.3:
            tail = [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
            prompt = (rng.choice(stems) + tail)[:40] or [1]
            req = Request(f"r{step}", prompt, SamplingParams(max_tokens=8))
            sched.add(req)
            live.append(req)
        if live and rng.random() < 0.1:
            sched.finish(live.pop(rng.randrange(len(live))), "abort")
        _step(sched, kv)
        for req in [r for r in live if len(r.output_token_ids) >= 8]:
            sched.finish(req, "length")
            live.remove(req)
        holders: dict[int, int] = {}
        for req in sched.running:
            assert req.status is RequestStatus.RUNNING
            assert len(req.block_ids) >= alloc.blocks_for(req.num_computed_tokens)
            for b in req.block_ids:
                holders[b] = holders.get(b, 0) + 1
            tokens = req.all_token_ids
            for p in range(req.num_computed_tokens):
                assert kv[req.block_ids[p // bs]][p % bs] == tuple(tokens[: p + 1])
            assert req.num_computed_tokens < req.num_tokens or not req.output_token_ids
        for b in range(alloc.num_blocks):
            assert alloc.ref_count(b) == holders.get(b, 0)
        assert alloc.num_free == alloc.num_blocks - len(holders)
        hits = alloc.prefix_cache.stats.hits
    for req in live:
        sched.finish(req, "abort")
    assert alloc.num_free == alloc.num_blocks
    assert hits <= alloc.prefix_cache.stats.queries


def test_random_traffic_hits_the_cache():
    """The property above is not vacuous: shared stems do produce hits."""
    alloc = BlockAllocator(num_blocks=64, block_size=4, enable_prefix_caching=True)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), alloc)
    stem = list(range(20))
    for i in range(3):
        sched.add(Request(f"r{i}", stem + [100 + i], SamplingParams()))
        _step(sched)
    assert alloc.prefix_cache.stats.hits == 2 * 20
