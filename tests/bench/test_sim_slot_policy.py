"""bench/sim_slot_policy.py: hit rates of both slot policies from the engine's lookup twin,
per fraction, on a small routing-model stream; with a slot for every expert (fraction 1.0)
they agree; at 10% of a skewed stream LFU hits more than LRU."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import sim_slot_policy  # noqa: E402


def test_hit_rates_by_policy(monkeypatch):
    monkeypatch.setitem(sim_slot_policy.SHAPES, "olmoe", (4, 64))  # 4 layers: quick
    rates = sim_slot_policy.hit_rates("olmoe", 1, [0.1, 1.0], warm=64, steps=128, seed=0)
    assert set(rates) == {0.1, 1.0} and set(rates[0.1]) == {"lru", "lfu"}
    # every expert has a slot: nothing is evicted, the policies agree (the few misses are
    # experts first routed after the warm-up)
    assert rates[1.0]["lru"] == rates[1.0]["lfu"] > 0.99
    assert rates[0.1]["lfu"] > rates[0.1]["lru"] > 0
