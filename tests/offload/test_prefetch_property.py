"""Prefetch reservations (reference twin) interleaved with lookups, against plain-Python
models (LRU and `lfu` slots), on adversarial streams: predictions right, wrong, withheld,
repeated, wider than the slots. Same tables, copies and counters; a reservation never
evicts an expert it predicts and never touches overflow rows; after every lookup + fill
each row a call reads holds its expert; the prefetch statistics add up; other layers of a
pool are never written."""

from __future__ import annotations

import random

import torch
from lru_model import random_expert_set, random_streams, routing_stream
from prefetch_model import PyPrefetchLFU, PyPrefetchLRU, prediction_for

from xinfer.offload.lookup import fill_reference, lookup_reference
from xinfer.offload.prefetch_table import (
    DROPPED,
    PREDICTED,
    PREFETCHED,
    PRESENT,
    USED,
    WASTED,
    PrefetchTable,
    reserve_reference,
)
from xinfer.offload.slot_cache import HITS, MISSES, NUM_COUNTERS, SlotCache
from xinfer.offload.slot_pool import build_slot_caches

CPU = torch.device("cpu")


def holds(cache: SlotCache, host: dict, row: int, expert: int) -> bool:
    return all(torch.equal(cache.slots[n][row], t[expert]) for n, t in host.items())


def run_stream(
    num_experts: int, num_slots: int, top_k: int, seed: int, num_calls: int, policy: str = "lru"
) -> None:
    host = random_expert_set(num_experts, seed)
    cache = SlotCache(host, num_slots, CPU, policy=policy)
    table = PrefetchTable(cache)
    model = (PyPrefetchLFU if policy == "lfu" else PyPrefetchLRU)(num_experts, num_slots)
    rng = random.Random(seed)
    for ids in routing_stream(rng, num_experts, num_slots, top_k, num_calls):
        pred = prediction_for(rng, ids, num_experts)
        predicted = {e for e in pred.reshape(-1).tolist() if e >= 0}
        held_before = cache.expert_of_slot.tolist()
        want_copies = model.reserve(pred.reshape(-1).tolist())
        reserve_reference(table, pred)
        n = int(table.miss_count)
        copies = list(zip(table.miss_ids[:n].tolist(), table.miss_slots[:n].tolist()))
        assert copies == want_copies
        for _, s in copies:  # a victim never held a predicted expert, never an overflow row
            assert s < num_slots and held_before[s] not in predicted
        cache.check_invariants()
        fill_reference(table.fill_target(), host)
        for e, s in copies:
            assert holds(cache, host, s, e)
        want_rows, _ = model.call(ids.reshape(-1).tolist())
        rows = lookup_reference(cache, ids)
        assert rows.reshape(-1).tolist() == want_rows
        if policy == "lfu":
            assert cache.score.tolist() == model.count
        fill_reference(cache, host)
        for e, r in zip(ids.reshape(-1).tolist(), rows.reshape(-1).tolist()):
            assert holds(cache, host, r, e), (e, r)
        for s, e in enumerate(cache.expert_of_slot.tolist()):
            assert e < 0 or holds(cache, host, s, e)
    c = table.counters.tolist()
    pending = sum(1 for e in table.pending.tolist() if e >= 0)
    columns = (PREDICTED, PRESENT, PREFETCHED, DROPPED, USED, WASTED)
    got = dict(zip(model.counts, (c[col] for col in columns)))
    assert got == model.counts
    assert c[PREDICTED] == c[PRESENT] + c[PREFETCHED] + c[DROPPED]
    assert c[PREFETCHED] == c[USED] + c[WASTED] + pending
    assert (int(cache.counters[HITS]), int(cache.counters[MISSES])) == (model.hits, model.misses)
    return model


@random_streams
def test_reservations_match_python_model(num_experts, num_slots, top_k, seed):
    run_stream(num_experts, num_slots, top_k, seed, num_calls=25)


@random_streams
def test_lfu_reservations_match_python_model(num_experts, num_slots, top_k, seed):
    run_stream(num_experts, num_slots, top_k, seed, num_calls=25, policy="lfu")


def test_lfu_reservation_refuses_what_the_lookup_would():
    """Long streams under `lfu`: the admission test drops predictions (the rule is
    exercised, not only the victim order), and the model still agrees."""
    model = run_stream(20, 7, 3, seed=4, num_calls=80, policy="lfu")
    assert model.refused_reservations > 0 and model.counts["prefetched"] > 0


def test_lfu_reservation_hand_worked():
    """Four experts, two slots, `lfu`. Calls [0, 1], [0, 2], [0, 2] leave counts 0: 2704,
    1: 784, 2: 1920 (x - x // 8, + 1024 a call) and slots [0, 2]. A reservation of expert 3
    (count 0) meets slot 1 (expert 2, the lower count decayed: 1680 against 2366) and is
    refused (1680 > 0 + 1024); one of expert 1 is admitted there (1680 <= 686 + 1024), the
    slot's score becomes expert 1's count, and no count moves."""
    host = random_expert_set(4, 0)
    cache = SlotCache(host, 2, CPU, policy="lfu")
    table = PrefetchTable(cache)
    for ids in ([[0, 1]], [[0, 2]], [[0, 2]]):
        lookup_reference(cache, torch.tensor(ids, dtype=torch.int32))
    assert cache.score.tolist() == [2704, 784, 1920, 0]
    assert cache.expert_of_slot.tolist() == [0, 2]
    reserve_reference(table, torch.tensor([[3]], dtype=torch.int32))
    assert int(table.miss_count) == 0 and int(table.counters[DROPPED]) == 1
    assert cache.expert_of_slot.tolist() == [0, 2]
    reserve_reference(table, torch.tensor([[1]], dtype=torch.int32))
    assert int(table.miss_count) == 1
    assert (int(table.miss_ids[0]), int(table.miss_slots[0])) == (1, 1)
    assert cache.expert_of_slot.tolist() == [0, 1] and cache.slot_score.tolist() == [2704, 784]
    assert cache.score.tolist() == [2704, 784, 1920, 0]
    cache.check_invariants()


def test_perfect_prediction_turns_misses_into_used_prefetches():
    """Predicting exactly the next call: every miss of the lookup-only run becomes a used
    prefetch (when the call fits the slots), the lookups see only hits."""
    host = random_expert_set(30, 1)
    cache = SlotCache(host, 10, CPU)
    table = PrefetchTable(cache)
    rng = random.Random(3)
    for _ in range(40):
        ids = torch.tensor([rng.sample(range(30), 4)], dtype=torch.int32)
        reserve_reference(table, ids)
        fill_reference(table.fill_target(), host)
        lookup_reference(cache, ids)
        assert int(cache.miss_count) == 0
    reserve_reference(table, torch.full((1, 1), -1, dtype=torch.int32))  # settle the last
    c = table.counters.tolist()
    assert int(cache.counters[MISSES]) == 0 and c[WASTED] == 0 and c[DROPPED] == 0
    assert c[USED] == c[PREFETCHED] > 0


def test_prefetch_never_writes_other_layers_of_a_pool():
    """Three layers over one pool (overflow rows past the later layers' slots): reservations
    and prefetch fills of one layer, lookups with overflow of the others; every layer's
    cached experts stay intact."""
    num_layers, num_experts, num_slots = 3, 12, 3
    hosts = [random_expert_set(num_experts, seed=i) for i in range(num_layers)]
    counters = torch.zeros(num_layers, NUM_COUNTERS, dtype=torch.int64)
    caches, _ = build_slot_caches(hosts, [num_slots] * num_layers, CPU, counters, 40)
    tables = [PrefetchTable(c) for c in caches]
    rng = random.Random(9)
    for step in range(60):
        layer = step % num_layers
        ids = routing_stream(rng, num_experts, num_slots, 2, 1, max_rows=10)[0]
        target = (layer + 1) % num_layers
        reserve_reference(tables[target], prediction_for(rng, ids, num_experts))
        fill_reference(tables[target].fill_target(), hosts[target])
        lookup_reference(caches[layer], ids)
        fill_reference(caches[layer], hosts[layer])
        for other in range(num_layers):
            for s, e in enumerate(caches[other].expert_of_slot.tolist()):
                assert e < 0 or holds(caches[other], hosts[other], s, e), (step, other, s)
