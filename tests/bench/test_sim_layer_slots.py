"""bench/sim_layer_slots.py's core: the vectorised per-layer LRU replays the engine's lookup
(offload/lookup.py) call by call at any per-layer slot counts, overflow included; miss curves
agree with single caches; the greedy allocation spends exactly the total, never below top-k
nor above E per layer, and gives slots where the curve drops; at equal device memory (the
planner's rows, shared regions included) it takes the most slots that fit; the stream's
batch layout."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from xinfer.offload.lookup import lookup_reference
from xinfer.offload.sizing import LayerShape, device_bytes_for
from xinfer.offload.slot_cache import HITS, MISSES, SlotCache

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from sim_layer_slots import (  # noqa: E402
    device_rows,
    draw_calls,
    greedy_allocation,
    greedy_within_rows,
    lower_hull,
    miss_curves,
    simulate_lru,
)


def skewed_calls(rng: np.random.Generator, steps: int, layers: int, experts: int, top_k: int,
                 batch: int) -> np.ndarray:  # fmt: skip
    """(steps, L, batch·k): each token k distinct experts from a skewed popularity (a
    different one per layer), so that tokens of a call share experts and LRU ties occur."""
    out = np.empty((steps, layers, batch * top_k), dtype=np.int64)
    for layer in range(layers):
        p = rng.permutation(experts).astype(float) + 1.0
        p = p**3 / (p**3).sum()
        for t in range(steps):
            for b in range(batch):
                out[t, layer, b * top_k : (b + 1) * top_k] = rng.choice(
                    experts, top_k, replace=False, p=p
                )
    return out


def lookup_counts(calls: np.ndarray, layer: int, num_slots: int, experts: int) -> np.ndarray:
    """(steps, 2) hits and misses of each call of `layer` through the engine's lookup."""
    host = {"w": torch.zeros(experts, 1)}
    cache = SlotCache(host, num_slots, torch.device("cpu"))
    out = []
    for t in range(calls.shape[0]):
        before = cache.counters[[HITS, MISSES]].clone()
        lookup_reference(cache, torch.from_numpy(calls[t, layer]).view(1, -1))
        out.append((cache.counters[[HITS, MISSES]] - before).tolist())
    return np.array(out)


@pytest.mark.parametrize("batch", [1, 3])
def test_simulator_replays_the_engine_lookup_call_by_call(batch):
    experts, top_k, steps = 12, 3, 150
    slots = np.array([3, 5, 8, 12])  # k (overflow at batch 3), two between, all resident
    calls = skewed_calls(np.random.default_rng(batch), steps, len(slots), experts, top_k, batch)
    want = np.stack([lookup_counts(calls, layer, s, experts) for layer, s in enumerate(slots)])
    layer_of = np.arange(len(slots))
    for t in range(steps):  # the simulator is deterministic: prefix runs give each call
        hits, misses = simulate_lru(calls[: t + 1], layer_of, slots, experts, warm=t)
        assert hits.tolist() == want[:, t, 0].tolist(), (t, hits, want[:, t, 0])
        assert misses.tolist() == want[:, t, 1].tolist(), (t, misses, want[:, t, 1])
    if batch == 3:  # the case is meant to reach the overflow rows at S = k
        assert (want[0, :, 1] > slots[0]).any()


def test_all_resident_misses_each_expert_once_and_warm_skips_calls():
    calls = skewed_calls(np.random.default_rng(7), 30, 2, 10, 2, 2)
    hits, misses = simulate_lru(calls, np.array([0, 1]), np.array([10, 10]), 10)
    for layer in range(2):
        distinct_per_call = sum(len(set(calls[t, layer].tolist())) for t in range(30))
        assert misses[layer] == len(set(calls[:, layer].reshape(-1).tolist()))
        assert hits[layer] + misses[layer] == distinct_per_call
    late_hits, late_misses = simulate_lru(calls, np.array([0]), np.array([10]), 10, warm=29)
    assert late_hits[0] + late_misses[0] == len(set(calls[29, 0].tolist()))


def test_miss_curves_match_single_caches_and_fall_at_batch_one():
    experts, top_k = 12, 3
    calls = skewed_calls(np.random.default_rng(3), 60, 2, experts, top_k, 1)
    curves = miss_curves(calls, experts, top_k, warm=10)
    assert curves.shape == (2, experts + 1) and np.isnan(curves[:, :top_k]).all()
    for s in (top_k, 7, experts):
        _, misses = simulate_lru(calls, np.array([0, 1]), np.array([s, s]), experts, warm=10)
        assert curves[:, s].tolist() == misses.tolist()
    # one token per call: LRU's inclusion property, more slots never miss more
    assert (np.diff(curves[:, top_k:], axis=1) <= 0).all()
    assert curves[0, top_k] > curves[0, experts]


def test_lower_hull_is_a_convex_minorant_through_the_ends():
    values = np.array([10.0, 10.0, 10.0, 4.0, 3.0, 2.9, 0.0])
    hull = lower_hull(values)
    assert (hull <= values + 1e-12).all()
    assert hull[0] == values[0] and hull[-1] == values[-1]
    assert (np.diff(hull, 2) >= -1e-12).all()  # convex
    assert hull[1] < values[1]  # the flat start is bridged


def test_greedy_allocation_spends_the_total_within_bounds():
    rng = np.random.default_rng(0)
    layers, experts, top_k = 6, 16, 4
    curves = np.full((layers, experts + 1), np.nan)
    drops = rng.uniform(0.5, 3.0, layers)  # each layer's miss curve: a decaying exponential
    for layer in range(layers):
        s = np.arange(top_k, experts + 1)
        curves[layer, top_k:] = 1000 * np.exp(-(s - top_k) / (drops[layer] * 3))
    for total in (layers * top_k, 40, 61, layers * experts):
        alloc = greedy_allocation(curves, total, top_k)
        assert alloc.sum() == total
        assert alloc.min() >= top_k and alloc.max() <= experts
    with pytest.raises(ValueError):
        greedy_allocation(curves, layers * top_k - 1, top_k)
    with pytest.raises(ValueError):
        greedy_allocation(curves, layers * experts + 1, top_k)


def test_greedy_gives_slots_where_the_curve_drops():
    top_k, experts = 2, 10
    s = np.arange(top_k, experts + 1, dtype=float)
    curves = np.full((3, experts + 1), np.nan)
    curves[0, top_k:] = 100.0  # flat: no slot saves anything
    curves[1, top_k:] = 100.0 - 10 * (s - top_k)  # 10 per slot
    curves[2, top_k:] = np.where(s < 5, 100.0, 100.0 - 30 * (s - 4))  # flat, then 30 per slot
    curves[2, top_k:] = np.maximum(curves[2, top_k:], 0.0)
    # layer 2's hull: 100 → 10 from 2 to 7 slots (18 per slot), then 10 → 0 at 8, then 0
    alloc = greedy_allocation(curves, 3 * top_k + 5, top_k)
    assert alloc.tolist() == [top_k, top_k, 7]  # its 18s beat layer 1's 10s
    alloc = greedy_allocation(curves, 3 * top_k + 14, top_k)
    assert alloc.tolist() == [top_k, experts, 8]  # then every 10, none of the 0s


def test_greedy_within_rows_fits_the_uniform_device_memory_and_no_more():
    layers, experts, top_k = 5, 16, 2
    s = np.arange(top_k, experts + 1, dtype=float)
    curves = np.full((layers, experts + 1), np.nan)
    for layer in range(layers):  # layer 0 flat, the others ever steeper
        curves[layer, top_k:] = 500 * np.exp(-(s - top_k) * layer / 4)
    uniform = np.full(layers, 6)
    shape = LayerShape(experts, top_k, 1)  # one byte an expert: bytes are rows
    assert device_rows(uniform, experts) == device_bytes_for([shape] * layers, 6)
    rows = device_rows(uniform, experts)
    alloc = greedy_within_rows(curves, rows, top_k)
    assert alloc.min() == top_k < 6  # the flat layer gives its slots away ...
    assert device_rows(alloc, experts) <= rows
    assert alloc.sum() < uniform.sum()  # ... and the wider regions cost slots
    assert alloc.sum() == rows - 2 * (experts - top_k)  # the most that fit
    with pytest.raises(ValueError):
        greedy_within_rows(curves, layers * top_k + 2 * (experts - top_k) - 1, top_k)


def test_a_batch_call_is_its_requests_side_by_side():
    args = ("qwen3-30b-a3b", 0, 3, 16, 2)
    both = draw_calls(*args, batch=2, num_steps=5, first_key=40)
    first = draw_calls(*args, batch=1, num_steps=5, first_key=40)
    second = draw_calls(*args, batch=1, num_steps=5, first_key=41)
    assert both.shape == (5, 3, 4)
    assert np.array_equal(both, np.concatenate([first, second], axis=2))
    other = draw_calls(*args, batch=1, num_steps=5, first_key=1040)
    assert not np.array_equal(first, other)  # held-out keys draw other experts
