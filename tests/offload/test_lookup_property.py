"""The reference lookup/fill against a plain-Python LRU model on random routing streams:
same slot ids, same misses and victims, same counters; tables stay consistent and every
slot holds its expert's bytes after fill."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lru_model import PyLRU, random_expert_set, routing_stream

from xinfer.offload.lookup import count_distinct, fill_reference, lookup_reference
from xinfer.offload.slot_cache import CALLS, HITS, MISSES, SlotCache


def make_cache(host: dict[str, torch.Tensor], num_slots: int) -> SlotCache:
    return SlotCache(host, num_slots, torch.device("cpu"), torch.zeros(4, dtype=torch.int64))


def run_stream(num_experts: int, num_slots: int, top_k: int, seed: int, num_calls: int) -> None:
    host = random_expert_set(num_experts, seed)
    cache, model = make_cache(host, num_slots), PyLRU(num_experts, num_slots)
    rng = random.Random(seed)
    for ids in routing_stream(rng, num_experts, num_slots, top_k, num_calls):
        want_slots, want_fills = model.call(ids.reshape(-1).tolist())
        slot_ids = lookup_reference(cache, ids)
        assert slot_ids.dtype == torch.int32 and slot_ids.shape == ids.shape
        assert slot_ids.reshape(-1).tolist() == want_slots
        n = int(cache.miss_count)
        got_fills = list(zip(cache.miss_ids[:n].tolist(), cache.miss_slots[:n].tolist()))
        assert got_fills == want_fills
        assert cache.expert_of_slot[slot_ids.long()].tolist() == ids.tolist()
        cache.check_invariants()
        fill_reference(cache, host)
        for s, e in enumerate(cache.expert_of_slot.tolist()):
            if e >= 0:
                for name, t in host.items():
                    assert torch.equal(cache.slots[name][s], t[e]), (name, s, e)
    counters = cache.counters.tolist()
    assert (counters[HITS], counters[MISSES]) == (model.hits, model.misses)
    assert counters[CALLS] == num_calls
    assert int(cache.clock) == num_calls


@settings(max_examples=60, deadline=None)
@given(
    num_experts=st.integers(2, 40),
    top_k=st.integers(1, 8),
    extra_slots=st.integers(0, 40),
    seed=st.integers(0, 2**31 - 1),
)
def test_lookup_matches_python_lru(num_experts, top_k, extra_slots, seed):
    top_k = min(top_k, num_experts)
    num_slots = min(num_experts, top_k + extra_slots)
    run_stream(num_experts, num_slots, top_k, seed, num_calls=25)


@pytest.mark.parametrize(
    "num_experts,num_slots,top_k",
    [(8, 2, 2), (16, 16, 4), (128, 8, 8), (64, 20, 6), (5, 5, 1)],
    ids=["S==k", "S==E", "S==k-large-E", "S<E", "S==E-k1"],
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


def test_too_many_distinct_experts_is_refused():
    cache = make_cache(random_expert_set(8, 0), 2)
    with pytest.raises(RuntimeError, match="staging"):
        lookup_reference(cache, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))


def test_count_distinct():
    ids = torch.tensor([[3, 1], [1, 3], [7, 0]], dtype=torch.int32)
    assert int(count_distinct(ids, 8)) == 4
