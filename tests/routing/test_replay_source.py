"""Replay as a routing source, driven like the engine drives it: request key n replays
recorded request n mod R, position p its entry (p − first) mod P; a forward context whose
tensors are refilled in place between forwards (a CUDA graph's static inputs) gets fresh
rows every forward; weights come from the router logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from routing_streams import context

from xinfer.errors import UserError
from xinfer.routing.replay import ReplayRouting
from xinfer.routing.trace import TraceHeader, TraceWriter
from xinfer.runner.forward_context import forward_context

L, E, K = 2, 10, 3


def _write_trace(path) -> dict[str, np.ndarray]:
    """Request "a": positions 0..5 (prompt of 4, then 2 decode steps); request "b":
    positions 16..18 (a cached 16-token prefix was not computed). Returns (L, P, k) each."""
    rng = np.random.default_rng(0)
    ids = {name: rng.integers(0, E, (L, n, K)).astype(np.int16) for name, n in (("a", 6), ("b", 3))}
    w = TraceWriter(path, TraceHeader(L, K, E))
    w.write([("a", 0, 4), ("b", 16, 3)], np.concatenate([ids["a"][:, :4], ids["b"]], axis=1))
    w.write([("a", 4, 1)], ids["a"][:, 4:5])
    w.write([("a", 5, 1)], ids["a"][:, 5:6])
    w.close()
    return ids


def _route(src, ctx, num_tokens):
    logits = torch.randn(num_tokens, E, generator=torch.Generator().manual_seed(num_tokens))
    with forward_context(ctx):
        out = [src.route(layer, logits, ctx, K, True) for layer in range(L)]
    return torch.stack([ids for _, ids in out]), out[0][0], logits


def test_streams_by_key_and_position(tmp_path):
    want = _write_trace(tmp_path / "t")
    src = ReplayRouting(str(tmp_path / "t"), [E] * L, [K] * L, torch.device("cpu"))
    assert src.stream_ids == ["a", "b"]
    # key 0 → "a" from position 0 (8 tokens: wraps after 6); key 3 → "b" (first position 16)
    ids, weights, logits = _route(src, context([8, 2], [0, 16], [0, 1], [0, 3]), 10)
    a = want["a"][:, [0, 1, 2, 3, 4, 5, 0, 1]]
    assert np.array_equal(ids[:, :8].numpy(), a)
    assert np.array_equal(ids[:, 8:].numpy(), want["b"][:, :2])
    probs = torch.softmax(logits, -1).gather(1, ids[0].long())
    torch.testing.assert_close(weights, probs / probs.sum(-1, keepdim=True))


def test_refilled_context_gets_fresh_rows(tmp_path):
    want = _write_trace(tmp_path / "t")
    src = ReplayRouting(str(tmp_path / "t"), [E] * L, [K] * L, torch.device("cpu"))
    ctx = context([1], [2], [0], [0])  # one decode row, like a graph of batch 1
    first, _, _ = _route(src, ctx, 1)
    ctx.seq_lens.fill_(5)  # the next step refills the same tensors: position 4
    second, _, _ = _route(src, ctx, 1)
    assert np.array_equal(first[:, 0].numpy(), want["a"][:, 2])
    assert np.array_equal(second[:, 0].numpy(), want["a"][:, 4])


def test_mismatched_trace_is_refused(tmp_path):
    _write_trace(tmp_path / "t")
    with pytest.raises(UserError, match="MoE layers"):
        ReplayRouting(str(tmp_path / "t"), [E] * 3, [K] * 3, torch.device("cpu"))
    with pytest.raises(UserError, match="routes to expert"):
        ReplayRouting(str(tmp_path / "t"), [4] * L, [K] * L, torch.device("cpu"))
    data = (tmp_path / "t").read_bytes()
    (tmp_path / "cut").write_bytes(data[:-5])
    with pytest.raises(UserError, match="ends inside a record"):
        ReplayRouting(str(tmp_path / "cut"), [E] * L, [K] * L, torch.device("cpu"))
