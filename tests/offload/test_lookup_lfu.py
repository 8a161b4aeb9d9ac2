"""The `lfu` slot policy (`--moe-offload-policy lfu`): the reference lookup against a
plain-Python model of the rule (tests/offload/lru_model.py `PyLFU`) on random routing
streams, a hand-worked call sequence (decay, victim order, a miss refused, its call-local
row), the overflow bound, and what the policy is for: on the routing models' streams it
keeps more of the experts a layer needs than LRU at the same slots."""

from __future__ import annotations

import random

import pytest
import torch
from lru_model import PyLFU, random_expert_set, random_streams, routing_stream

from xinfer.offload.lookup import fill_reference, lookup_reference
from xinfer.offload.slot_cache import HITS, MISSES, OVERFLOW, SlotCache

CPU = torch.device("cpu")


def _run(num_experts, num_slots, top_k, seed, num_calls, num_overflow=None):
    host = random_expert_set(num_experts, seed)
    kw = {} if num_overflow is None else {"num_overflow": num_overflow}
    cache = SlotCache(host, num_slots, CPU, policy="lfu", **kw)
    model = PyLFU(num_experts, num_slots, num_overflow)
    rng = random.Random(seed)
    for ids in routing_stream(rng, num_experts, num_slots, top_k, num_calls):
        if ids.numel() > cache.capacity and cache.capacity < num_experts:
            continue  # too wide for the few overflow rows: refused (tested elsewhere)
        want_rows, want_fills = model.call(ids.reshape(-1).tolist())
        rows = lookup_reference(cache, ids)
        assert rows.reshape(-1).tolist() == want_rows
        # every row is a slot or one of the call's overflow rows, never past them
        over = {r for r in want_rows if r >= num_slots}
        assert len(over) <= cache.num_overflow
        assert all(r < cache.overflow_base + cache.num_overflow for r in over)
        n = int(cache.miss_count)
        assert list(zip(cache.miss_ids[:n].tolist(), cache.miss_slots[:n].tolist())) == want_fills
        assert cache.score.tolist() == model.count
        cache.check_invariants()
        fill_reference(cache, host)
        for e, r in zip(ids.reshape(-1).tolist(), rows.reshape(-1).tolist()):
            for name, t in host.items():  # every row the MoE kernel reads holds its expert
                assert torch.equal(cache.slots[name][r], t[e]), (name, e, r)
    counters = cache.counters.tolist()
    assert (counters[HITS], counters[MISSES], counters[OVERFLOW]) == (
        model.hits,
        model.misses,
        model.overflow,
    )
    return model


@random_streams
def test_lfu_lookup_matches_python_model(num_experts, num_slots, top_k, seed):
    _run(num_experts, num_slots, top_k, seed, num_calls=25)


def test_lfu_refuses_and_respects_the_overflow_rows():
    """Long streams refuse misses (the rule is exercised), and with only 3 overflow rows
    a call never sends more than 3 misses there, refused or not."""
    model = _run(64, 20, 6, seed=3, num_calls=300)
    assert model.refused > 0
    few = _run(20, 4, 2, seed=7, num_calls=300, num_overflow=3)
    assert few.refused > 0


def _caller(num_experts: int, num_slots: int):
    host = random_expert_set(num_experts, seed=0)
    cache = SlotCache(host, num_slots, CPU, policy="lfu")

    def call(e: int) -> int:
        row = int(lookup_reference(cache, torch.tensor([[e]]))[0, 0])
        fill_reference(cache, host)
        return row

    return cache, call


def test_lfu_victim_is_the_least_counted_not_the_least_recent():
    """E = 4, S = 2, one id a call; counts after each call's decay (x - x >> 3) and count."""
    cache, call = _caller(4, 2)
    assert [call(0), call(0), call(1)] == [0, 0, 1]  # empty slots first, by index
    assert cache.score.tolist() == [1680, 1024, 0, 0]  # 1024 → 1920 → 1680; 1 new
    # 2 (1024) is offered the least counted free slot: slot 1 (expert 1: 896), though
    # slot 0 was used longer ago (LRU would take slot 0); 1024 >= 896: admitted
    assert call(2) == 1
    assert cache.expert_of_slot.tolist() == [0, 2]
    assert cache.score.tolist() == [1470, 896, 1024, 0]
    assert cache.slot_score.tolist() == [1470, 1024]


def test_lfu_refuses_a_miss_counted_below_its_victim():
    """E = 4, S = 1: a newcomer below the resident's count is served from an overflow row
    and evicts nothing; routed again, its count passes the resident's and it is admitted."""
    cache, call = _caller(4, 1)
    assert [call(0), call(0)] == [0, 0]  # expert 0: 1024, then 1920
    assert call(1) == 1  # 1 (1024) < 0 (1680): refused, overflow row 1 (= S)
    assert cache.expert_of_slot.tolist() == [0]
    assert int(cache.counters[OVERFLOW]) == 1
    assert call(1) == 0  # 1 (1920) >= 0 (1470): admitted
    assert cache.expert_of_slot.tolist() == [1]
    assert call(0) == 0  # 0 (1287 + 1024 = 2311) >= 1 (1680): admitted back
    assert cache.score.tolist()[:2] == [2311, 1680]
    assert int(cache.counters[OVERFLOW]) == 1


@pytest.mark.parametrize("preset,layers,experts", [("qwen3-30b-a3b", 8, 128), ("olmoe", 8, 64)])
def test_lfu_keeps_more_of_what_the_routing_models_need(preset, layers, experts):
    """What the policy is for: at 10% of the experts, batch 1, on a routing model's stream
    (the benchmarks' model of real routing), LFU hits more often than LRU (simulated over
    the reference lookups; at full size, 48 layers, bench/NOTES.md: 62.1 → 67.3% for the
    Qwen3 preset). Each layer is its own cache; counted after 64 warm-up calls."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from sim_layer_slots import draw_calls

    top_k, warm, steps = 8, 64, 192
    calls = draw_calls(preset, 0, layers, experts, top_k, 1, warm + steps, 1000)
    num_slots = max(top_k, -(-experts // 10))
    hit_rate = {}
    for policy in ("lru", "lfu"):
        hits = misses = 0
        for layer in range(layers):
            host = {"w": torch.zeros(experts, 1)}
            cache = SlotCache(host, num_slots, CPU, policy=policy)
            for t in range(warm + steps):
                if t == warm:
                    cache.counters.zero_()
                lookup_reference(cache, torch.from_numpy(calls[t, layer]).view(1, -1))
            hits += int(cache.counters[HITS])
            misses += int(cache.counters[MISSES])
        hit_rate[policy] = hits / (hits + misses)
    assert hit_rate["lfu"] > hit_rate["lru"] + 0.02, hit_rate
