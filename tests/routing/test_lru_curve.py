"""The routing model's presets against published LRU hit rates (docs/moe_offload.md,
"Routing model"): a plain per-layer LRU over each preset's stream, batch 1, within ±6 points
of every published point and of the steady-state predictions the model was fitted to.

One published point is out of the model's reach, and the test says so instead of widening
its tolerance: Qwen3-30B-A3B at 6.25% (8 slots, top-8) is published as 36.6% cold, but with
S = k an LRU at batch 1 holds exactly the previous token's experts, so its hit rate *is* the
token-to-token repeat rate — published as ~45% for the same model. The preset matches the
repeat rate (and the other points), so it lands near 46% there; the test pins that."""

from __future__ import annotations

import functools

import pytest
from routing_streams import hit_curve, model_streams, repeat_rate, sampled_layers

from xinfer.routing.config import PRESETS

TOLERANCE = 6.0
# preset → (MoE layers, experts, top-k, cold requests): the shape each was published for
SHAPES = {
    "qwen3-30b-a3b": (48, 128, 8, 4),
    "qwen3.5-35b-a3b": (40, 256, 8, 4),
    "olmoe": (16, 64, 8, 8),
}
# experts resident (fraction) → LRU hit rate, percent; cold over 256 tokens
PUBLISHED_COLD = {
    "qwen3-30b-a3b": {0.19: 74.1, 0.38: 89.4, 0.64: 96.2},
    "qwen3.5-35b-a3b": {0.22: 74.1},
    "olmoe": {0.25: 51.4},
}
# the steady state the fit predicts (after 500 tokens of warm-up)
PREDICTED_STEADY = {
    "qwen3-30b-a3b": {0.10: 58, 0.20: 80, 0.35: 90, 0.50: 95},
    "qwen3.5-35b-a3b": {0.10: 56, 0.20: 74, 0.35: 85, 0.50: 91},
}
PUBLISHED_REPEAT_QWEN3 = 45.0  # % of experts chosen again by the next token


def _streams(name: str, num_requests: int, num_tokens: int, seed: int):
    num_layers, num_experts, top_k, _ = SHAPES[name]
    layers, weights = sampled_layers(num_layers)
    streams = model_streams(
        PRESETS[name], layers, num_layers, num_experts, top_k, num_requests, num_tokens, seed
    )
    return streams, weights


@functools.cache
def _cold(name: str):
    return _streams(name, SHAPES[name][3], 256, seed=0)


@pytest.mark.parametrize("name", sorted(PREDICTED_STEADY))
def test_steady_state_matches_the_prediction(name):
    streams, weights = _streams(name, 2, 1500, seed=1)
    num_experts = SHAPES[name][1]
    got = hit_curve(streams, weights, num_experts, list(PREDICTED_STEADY[name]), warm=500)
    for fraction, want in PREDICTED_STEADY[name].items():
        assert abs(got[fraction] - want) <= TOLERANCE, (name, fraction, got[fraction], want)
    rates = [got[f] for f in sorted(got)]
    assert rates == sorted(rates)  # more slots, more hits


@pytest.mark.parametrize("name", sorted(PUBLISHED_COLD))
def test_cold_curve_matches_published_points(name):
    streams, weights = _cold(name)
    num_experts = SHAPES[name][1]
    got = hit_curve(streams, weights, num_experts, list(PUBLISHED_COLD[name]))
    for fraction, want in PUBLISHED_COLD[name].items():
        assert abs(got[fraction] - want) <= TOLERANCE, (name, fraction, got[fraction], want)


def test_qwen3_at_top_k_slots_is_the_repeat_rate_not_the_published_point():
    """The known deviation, pinned: 8 slots of top-8 give the repeat rate (published ~45%),
    not the published 36.6% cold hit rate, which no plain LRU at batch 1 can show together
    with a 45% repeat rate."""
    streams, weights = _cold("qwen3-30b-a3b")
    at_k = hit_curve(streams, weights, 128, [8 / 128])[8 / 128]
    repeat = repeat_rate(streams, weights)
    assert abs(at_k - repeat) <= 1.0  # the identity (the cold start's 8 misses aside)
    assert abs(repeat - PUBLISHED_REPEAT_QWEN3) <= TOLERANCE
    assert 40 <= at_k <= 52 and at_k - 36.6 > TOLERANCE  # as documented: ~46 vs 36.6


def test_uniform_preset_hits_in_proportion_to_the_slots():
    """Experts drawn uniformly: an LRU of S of E experts hits S/E of the time."""
    layers, weights = sampled_layers(8)
    streams = model_streams(PRESETS["uniform"], layers, 8, 64, 4, 2, 600, seed=2)
    got = hit_curve(streams, weights, 64, [0.25, 0.5], warm=100)
    assert abs(got[0.25] - 25) <= 2.5 and abs(got[0.5] - 50) <= 2.5
