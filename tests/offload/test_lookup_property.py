"""The reference lookup/fill against a plain-Python LRU model on random routing streams, on
every input the contract in xinfer.offload.lookup names: narrow calls, duplicates, calls with
more distinct experts than slots (overflow rows), out-of-range ids and calls too wide for the
overflow (both rejected before any table changes). Same rows, misses, victims and counters;
tables stay consistent and every row the call reads holds its expert's bytes after fill."""

from __future__ import annotations

import random

import pytest
import torch
from lru_model import PyLRU, random_expert_set, random_streams, routing_stream

from xinfer.offload import kernels as offload_kernels
from xinfer.offload.lookup import fill_reference, lookup_reference
from xinfer.offload.slot_cache import (
    CALLS,
    HITS,
    MAX_CALL_MISSES,
    MISSES,
    OVERFLOW,
    SlotCache,
)


def make_cache(host: dict[str, torch.Tensor], num_slots: int, **kw) -> SlotCache:
    return SlotCache(host, num_slots, torch.device("cpu"), **kw)


def check_rows(cache: SlotCache, host: dict, ids: torch.Tensor, rows: torch.Tensor) -> None:
    """Every row a call's ids were rewritten to holds that expert's bytes."""
    for e, r in zip(ids.reshape(-1).tolist(), rows.reshape(-1).tolist()):
        for name, t in host.items():
            assert torch.equal(cache.slots[name][r], t[e]), (name, e, r)


def run_stream(num_experts: int, num_slots: int, top_k: int, seed: int, num_calls: int) -> None:
    host = random_expert_set(num_experts, seed)
    cache, model = make_cache(host, num_slots), PyLRU(num_experts, num_slots)
    rng = random.Random(seed)
    for ids in routing_stream(rng, num_experts, num_slots, top_k, num_calls):
        want_rows, want_fills = model.call(ids.reshape(-1).tolist())
        rows = lookup_reference(cache, ids)
        assert rows.dtype == torch.int32 and rows.shape == ids.shape
        assert rows.reshape(-1).tolist() == want_rows
        n = int(cache.miss_count)
        got_fills = list(zip(cache.miss_ids[:n].tolist(), cache.miss_slots[:n].tolist()))
        assert got_fills == want_fills
        in_slots = rows < num_slots
        assert cache.expert_of_slot[rows[in_slots].long()].tolist() == ids[in_slots].tolist()
        cache.check_invariants()
        fill_reference(cache, host)
        check_rows(cache, host, ids, rows)
        for s, e in enumerate(cache.expert_of_slot.tolist()):
            if e >= 0:
                for name, t in host.items():
                    assert torch.equal(cache.slots[name][s], t[e]), (name, s, e)
    counters = cache.counters.tolist()
    assert (counters[HITS], counters[MISSES]) == (model.hits, model.misses)
    assert counters[OVERFLOW] == model.overflow
    assert counters[MAX_CALL_MISSES] == model.max_call_misses
    assert counters[CALLS] == num_calls
    assert int(cache.clock) == num_calls


@random_streams
def test_lookup_matches_python_lru(num_experts, num_slots, top_k, seed):
    run_stream(num_experts, num_slots, top_k, seed, num_calls=25)


@pytest.mark.parametrize(
    "num_experts,num_slots,top_k",
    [(8, 2, 2), (16, 16, 4), (128, 8, 8), (64, 20, 6), (5, 5, 1), (40, 3, 3)],
    ids=["S==k", "S==E", "S==k-large-E", "S<E", "S==E-k1", "wide-calls"],
)
def test_lookup_edge_shapes(num_experts, num_slots, top_k):
    run_stream(num_experts, num_slots, top_k, seed=num_experts * 31 + num_slots, num_calls=200)


def test_duplicates_and_lru_order():
    host = random_expert_set(6, 0)
    cache = make_cache(host, 3)
    # Duplicates within one call are one expert: 2 distinct → 2 misses into empty slots 0, 1.
    ids = torch.tensor([[4, 1], [1, 4], [4, 1]], dtype=torch.int32)
    assert lookup_reference(cache, ids).tolist() == [[0, 1], [1, 0], [0, 1]]
    assert int(cache.miss_count) == 2
    assert lookup_reference(cache, torch.tensor([[2, 1]], dtype=torch.int32)).tolist() == [[2, 1]]
    # Slot 0 (expert 4, stamp 1) is now the least recently used; 1 and 2 have stamp 2.
    assert lookup_reference(cache, torch.tensor([[5, 3]], dtype=torch.int32)).tolist() == [[0, 1]]
    assert cache.slot_of_expert.tolist() == [-1, -1, 2, 1, -1, 0]
    assert cache.counters[HITS].item() == 1 and cache.counters[MISSES].item() == 5


def test_more_distinct_than_slots_uses_overflow_rows():
    host = random_expert_set(8, 0)
    cache = make_cache(host, 2)  # 2 slots, 6 overflow rows at 2..7
    lookup_reference(cache, torch.tensor([[6, 7]], dtype=torch.int32))  # 6 → 0, 7 → 1
    fill_reference(cache, host)
    # Hit 7 (slot 1), miss 0 takes slot 0 (LRU victim 6), then no free slot: 3 and 5 overflow.
    ids = torch.tensor([[0, 7], [3, 0], [5, 3]], dtype=torch.int32)
    rows = lookup_reference(cache, ids)
    assert rows.tolist() == [[0, 1], [2, 0], [3, 2]]
    assert cache.miss_ids[:3].tolist() == [0, 3, 5] and cache.miss_slots[:3].tolist() == [0, 2, 3]
    assert cache.slot_of_expert.tolist() == [0, -1, -1, -1, -1, -1, -1, 1]  # 3, 5: not cached
    fill_reference(cache, host)
    check_rows(cache, host, ids, rows)
    c = cache.counters
    assert (int(c[HITS]), int(c[MISSES]), int(c[OVERFLOW]), int(c[MAX_CALL_MISSES])) == (1, 5, 2, 3)


def test_every_expert_of_a_layer_in_one_call():
    host = random_expert_set(12, 1)
    cache = make_cache(host, 4)
    ids = torch.arange(12, dtype=torch.int32).flip(0).view(4, 3)
    rows = lookup_reference(cache, ids)
    fill_reference(cache, host)
    check_rows(cache, host, ids, rows)
    assert sorted(rows.reshape(-1).tolist()) == list(range(12))  # 4 slots + 8 overflow rows


def test_pool_view_overflow_base():
    """A cache over a view whose overflow rows start past other layers' slots."""
    host = random_expert_set(10, 2)
    pool = {n: torch.zeros(24, *t.shape[1:], dtype=t.dtype) for n, t in host.items()}
    view = {n: t[6:] for n, t in pool.items()}  # this layer's slots: pool rows 6..8
    cache = make_cache(host, 3, slots=view, overflow_base=9, num_overflow=7)
    model = PyLRU(10, 3, overflow_base=9)
    for ids in routing_stream(random.Random(3), 10, 3, 2, 40, max_rows=4):
        want_rows, _ = model.call(ids.reshape(-1).tolist())
        rows = lookup_reference(cache, ids)
        assert rows.reshape(-1).tolist() == want_rows
        fill_reference(cache, host)
        check_rows(cache, host, ids, rows)
    assert not pool["w13"][:6].any() and not pool["w13"][9:15].any()  # others' slots


@pytest.mark.parametrize("bad", [-1, 8, 1000])
def test_out_of_range_ids_are_rejected_before_any_change(bad):
    cache = make_cache(random_expert_set(8, 0), 3)
    before = cache.state()
    ids = torch.tensor([[1, 2], [bad, 3]], dtype=torch.int32)
    for lookup in (lookup_reference, offload_kernels.lookup):
        with pytest.raises(ValueError, match=rf"expert id {bad} is outside \[0, 8\)"):
            lookup(cache, ids)
    assert all(torch.equal(cache.state()[k], v) for k, v in before.items())
    assert int(cache.counters.sum()) == 0


def test_call_wider_than_the_overflow_is_rejected():
    cache = make_cache(random_expert_set(8, 0), 2, num_overflow=2)  # 4 experts a call at most
    with pytest.raises(ValueError, match="2 slots and 2 overflow rows"):
        lookup_reference(cache, torch.tensor([[0, 1], [2, 3], [4, 4]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"must be \(T, k\)"):
        lookup_reference(cache, torch.tensor([0, 1], dtype=torch.int32))
    rows = lookup_reference(cache, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
    assert rows.tolist() == [[0, 1], [2, 3]]
    full = make_cache(random_expert_set(8, 0), 2)  # overflow E - S: any call fits
    wide = torch.arange(8, dtype=torch.int32).repeat(4).view(8, 4)
    assert sorted(set(lookup_reference(full, wide).reshape(-1).tolist())) == list(range(8))
