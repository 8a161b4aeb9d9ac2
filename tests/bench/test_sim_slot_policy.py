"""bench/sim_slot_policy.py: hit rates of both slot policies from the engine's lookup twin,
per fraction: with a slot for every expert they agree; at 10% of a skewed routing-model
stream LFU hits more than LRU; a `--record-routing` trace of the same calls gives the same
rates (decode steps only, when asked, skip the prompt's record)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import sim_slot_policy as sim  # noqa: E402

from xinfer.routing.trace import TraceHeader, TraceWriter  # noqa: E402


def test_hit_rates_by_policy(monkeypatch):
    monkeypatch.setitem(sim.SHAPES, "olmoe", (4, 64))  # 4 layers: quick
    calls, experts = sim.model_calls("olmoe", 1, 192, seed=0)
    rates = sim.hit_rates(calls, experts, 8, [0.1, 1.0], warm=64)
    assert set(rates) == {0.1, 1.0} and set(rates[0.1]) == {"lru", "lfu"}
    # every expert has a slot: nothing is evicted, the policies agree (the few misses are
    # experts first routed after the warm-up)
    assert rates[1.0]["lru"] == rates[1.0]["lfu"] > 0.99
    assert rates[0.1]["lfu"] > rates[0.1]["lru"] > 0


def test_a_recorded_trace_gives_the_same_rates(monkeypatch, tmp_path):
    monkeypatch.setitem(sim.SHAPES, "olmoe", (4, 64))
    calls, experts = sim.model_calls("olmoe", 2, 96, seed=1)  # two requests decoding
    path = tmp_path / "routing.xrt"
    writer = TraceWriter(path, TraceHeader(4, 8, experts, "test"))
    prompt = np.random.default_rng(0).integers(0, experts, (4, 5, 8)).astype(np.int16)
    writer.write([("a", 0, 3), ("b", 0, 2)], prompt)  # a prompt step: 5 tokens
    for t, call in enumerate(calls):
        writer.write([("a", 3 + t, 1), ("b", 2 + t, 1)], call.reshape(4, 2, 8).astype(np.int16))
    writer.close()
    decode, e = sim.trace_calls(str(path), decode_only=True)
    assert e == experts and len(decode) == len(calls)
    assert all(np.array_equal(a, b) for a, b in zip(decode, calls))
    want = sim.hit_rates(calls, experts, 8, [0.2], warm=16)
    assert sim.hit_rates(decode, experts, 8, [0.2], warm=16) == want
    every, _ = sim.trace_calls(str(path), decode_only=False)
    assert len(every) == len(calls) + 1 and every[0].shape == (4, 40)


def test_a_shape_of_its_own():
    """`--shape L,E,K` routes the preset over another model's layers, experts and top-k (the
    Qwen1.5-MoE row: 24 × 60, top-4): each call holds batch × k ids in [0, E)."""
    calls, experts = sim.model_calls("qwen3-30b-a3b", 2, 40, seed=0, shape=(3, 60, 4))
    assert experts == 60 and len(calls) == 40
    assert all(c.shape == (3, 8) and 0 <= c.min() and c.max() < 60 for c in calls)
    rates = sim.hit_rates(calls, experts, 4, [7 / 60, 1.0], warm=8)
    assert rates[1.0]["lru"] == rates[1.0]["lfu"] and 0 < rates[7 / 60]["lfu"] < 1
