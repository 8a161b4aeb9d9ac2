"""The routing model as the engine drives it (CPU twin): a request's routing depends only on
(seed, request key, layer, position) — not on the batch around it, on padding rows, on how
its prompt was chunked, on a dropped look-ahead step or a recompute after preemption — and
its drift c is the AR(1) process of the spec; weights come from the real router logits."""

from __future__ import annotations

import pytest
import torch
from routing_streams import context

from xinfer.routing.config import PRESETS, RoutingModelParams
from xinfer.routing.parametric import ParametricRouting
from xinfer.routing.parametric_ops import (
    SequenceBatch,
    advance_state_reference,
    ar1_scan,
    weights_at,
)
from xinfer.runner.forward_context import forward_context

E, K, LAYERS = 24, 4, 3
PARAMS = PRESETS["qwen3-30b-a3b"]


def _source(rows: int = 8, seed: int = 0, params: RoutingModelParams = PARAMS):
    return ParametricRouting(params, seed, [E] * LAYERS, rows, "cpu")


def _route(source, lengths, starts, rows, keys, logits=None):
    """(L, T, k) ids of one forward over these sequences."""
    ctx = context(lengths, starts, rows, keys)
    num_tokens = sum(lengths)
    logits = torch.zeros(num_tokens, E) if logits is None else logits
    with forward_context(ctx):
        return torch.stack([source.route(i, logits, ctx, K, True)[1] for i in range(LAYERS)])


def _decode(source, row, key, positions):
    """Decode steps of one request at `positions`, one token each: (L, n, k)."""
    return torch.cat([_route(source, [1], [p], [row], [key]) for p in positions], dim=1)


def test_chunking_and_decode_give_the_prompt_walk():
    """A 40-token stream as one prompt, as chunks of 13/27, and as a 10-token prompt then
    30 decode steps: the same experts at every position."""
    whole = _route(_source(), [40], [0], [0], [5])
    chunked = torch.cat(
        [_route(src := _source(), [13], [0], [2], [5]), _route(src, [27], [13], [2], [5])], dim=1
    )
    stepped = _source()
    prefix = _route(stepped, [10], [0], [1], [5])
    decoded = torch.cat([prefix, _decode(stepped, 1, 5, range(10, 40))], dim=1)
    assert torch.equal(whole, chunked)
    assert torch.equal(whole, decoded)


def test_batch_neighbours_and_padding_do_not_matter():
    alone = _route(_source(), [6], [0], [3], [7])
    src = _source()
    # other requests before and after it, and two padding rows (key -1, the scratch row)
    mixed = _route(src, [3, 6, 1, 1, 4], [0, 0, 0, 0, 9], [0, 3, 8, 8, 5], [1, 7, -1, -1, 2])
    assert torch.equal(mixed[:, 3:9], alone)
    assert all(int(src.states[i].key[3]) == 7 for i in range(LAYERS))
    assert all(int(src.states[i].key[8]) != 7 for i in range(LAYERS))  # scratch: padding only


def test_dropped_look_ahead_and_preemption_repeat_the_same_routing():
    ref_src = _source()
    reference = torch.cat(
        [_route(ref_src, [5], [0], [0], [3]), _decode(ref_src, 0, 3, range(5, 9))], dim=1
    )
    src = _source()
    _route(src, [5], [0], [0], [3])
    got = [_decode(src, 0, 3, [5, 6])]
    _decode(src, 0, 3, [7])  # a queued look-ahead step at position 7, then dropped...
    got.append(_decode(src, 0, 3, [7, 8]))  # ...and position 7 computed again
    assert torch.equal(torch.cat([reference[:, :5]] + got, dim=1), reference)
    # preempted: recomputed from position 0 (prompt + outputs as one prompt)
    assert torch.equal(_route(src, [9], [0], [0], [3]), reference)


def test_a_row_taken_over_by_another_request_starts_it_fresh():
    src = _source(rows=2)
    _route(src, [12], [0], [0], [4])  # request 4 leaves its drift in row 0
    taken_over = _route(src, [6], [0], [0], [9])
    fresh = _route(_source(rows=2), [6], [0], [1], [9])
    assert torch.equal(taken_over, fresh)


def test_keys_and_seeds_choose_the_stream():
    a = _route(_source(seed=0), [30], [0], [0], [1])
    assert torch.equal(a, _route(_source(seed=0), [30], [0], [4], [1]))  # row is only storage
    assert not torch.equal(a, _route(_source(seed=0), [30], [0], [0], [2]))
    assert not torch.equal(a, _route(_source(seed=1), [30], [0], [0], [1]))
    assert all(len(set(row.tolist())) == K for row in a.reshape(-1, K))  # k distinct experts


def test_drift_is_the_specified_ar1_process():
    """c(0) ~ N(0, 1); c(t+1) = φ c(t) + √(1−φ²) N(0, 1): unit variance, lag-1 correlation φ,
    and the popularity z makes the layer's long-run choice uneven as σ says."""
    src = _source(rows=1, params=RoutingModelParams(2.0, 2.0, 0.9))
    n = 4000
    batch = SequenceBatch(
        torch.tensor([0, n], dtype=torch.int32), torch.tensor([n], dtype=torch.int32),
        torch.tensor([0]), torch.tensor([11]), False,
    )  # fmt: skip
    c, _, positions = advance_state_reference(src.states[2], batch, src.constants[2], n)
    assert positions.tolist() == list(range(n))
    assert abs(float(c.var()) - 1.0) < 0.15
    lag1 = torch.corrcoef(torch.stack([c[:-1].flatten(), c[1:].flatten()]))[0, 1]
    assert abs(float(lag1) - 0.9) < 0.02
    counts = torch.bincount(_route(src, [n], [0], [0], [12])[2].flatten(), minlength=E)
    z = src.constants[2].popularity
    assert torch.corrcoef(torch.stack([z, counts.float()]))[0, 1] > 0.7  # popular = chosen


def test_ar1_scan_equals_the_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 5, generator=g)
    decay = torch.rand(37, generator=g)
    decay[[0, 9, 20]] = 0.0  # segment starts
    y, want = ar1_scan(x, decay), []
    prev = torch.zeros(5)
    for i in range(37):
        prev = decay[i] * prev + x[i]
        want.append(prev)
    torch.testing.assert_close(y, torch.stack(want))


@pytest.mark.parametrize("renormalize", [True, False])
def test_weights_come_from_the_router_logits(renormalize):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, E, generator=g).to(torch.bfloat16)
    src = _source()
    ctx = context([5], [0], [0], [1])
    with forward_context(ctx):
        weights, ids = src.route(0, logits, ctx, K, renormalize)
    probs = torch.softmax(logits.float(), dim=-1)
    want = probs.gather(1, ids.long())
    if renormalize:
        want = want / want.sum(-1, keepdim=True)
    torch.testing.assert_close(weights, want)
    torch.testing.assert_close(weights_at(logits, ids, renormalize), want)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
