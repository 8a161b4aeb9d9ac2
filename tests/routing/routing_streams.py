"""Helpers of the routing tests: drive a routing source the way the engine does (through a
forward context of packed sequences) and a vectorised per-layer LRU over its stream."""

from __future__ import annotations

import numpy as np
import torch

from xinfer.routing.config import RoutingModelParams
from xinfer.routing.parametric import ParametricRouting
from xinfer.runner.forward_context import ForwardContext, forward_context


def context(lengths: list[int], starts: list[int], rows: list[int], keys: list[int]):
    """A forward context of sequences with `lengths[b]` new tokens from position
    `starts[b]`, state rows and request keys as given."""
    qsl = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    i32 = dict(dtype=torch.int32)
    return ForwardContext(
        slot_mapping=torch.zeros(qsl[-1], dtype=torch.int64),
        block_tables=torch.zeros(len(lengths), 1, **i32),
        seq_lens=torch.tensor([s + n for s, n in zip(starts, lengths)], **i32),
        query_start_loc=torch.tensor(qsl, **i32),
        max_query_len=max(lengths),
        max_seq_len=max(s + n for s, n in zip(starts, lengths)),
        request_rows=torch.tensor(rows, dtype=torch.int64),
        request_keys=torch.tensor(keys, dtype=torch.int64),
    )


def route_all_layers(source, ctx: ForwardContext, num_layers: int, num_experts: int, top_k: int,
                     logits: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """(L, T, k) int32 ids of every layer for the context's tokens."""
    num_tokens = int(ctx.query_start_loc[-1])
    if logits is None:
        logits = torch.zeros(num_tokens, num_experts)
    with forward_context(ctx):
        return torch.stack(
            [source.route(layer, logits, ctx, top_k, True)[1] for layer in range(num_layers)]
        )


def sampled_layers(num_layers: int, ramp_layers: int = 5) -> tuple[list[int], np.ndarray]:
    """Layers to simulate and their weights in the mean over all layers: every layer of the
    ramp (each its own scale) and four of the rest (identically distributed), standing for
    all of them — a fifth of the work for the same expected curve. Models of up to 16
    layers are simulated whole (four layers would leave the curve to four draws of z)."""
    if num_layers <= 16:
        return list(range(num_layers)), np.full(num_layers, 1.0 / num_layers)
    ramp = list(range(min(ramp_layers, num_layers)))
    rest = sorted({ramp_layers, num_layers // 3, 2 * num_layers // 3, num_layers - 1})
    rest = [r for r in rest if ramp_layers <= r < num_layers]
    weights = [1.0] * len(ramp) + [(num_layers - len(ramp)) / len(rest)] * len(rest)
    return ramp + rest, np.array(weights) / num_layers


def model_streams(params: RoutingModelParams, layers: list[int], num_layers: int,
                  num_experts: int, top_k: int, num_requests: int, num_tokens: int,
                  seed: int = 0) -> np.ndarray:  # fmt: skip
    """(requests, tokens, len(layers), k) ids of the given layers of an `num_layers`-layer
    model: each request one prompt of `num_tokens` tokens, in one prefill call per layer
    (the scan path; the decode path is tested against it). One thread: on a busy CI machine
    torch's two-thread elementwise ops wait for each other far longer than they work."""
    source = ParametricRouting(params, seed, [num_experts] * num_layers, num_requests, "cpu")
    ctx = context([num_tokens] * num_requests, [0] * num_requests,
                  list(range(num_requests)), list(range(num_requests)))  # fmt: skip
    logits = torch.zeros(num_requests * num_tokens, num_experts)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with forward_context(ctx):
            ids = torch.stack([source.route(i, logits, ctx, top_k, True)[1] for i in layers])
    finally:
        torch.set_num_threads(threads)
    ids = ids.reshape(len(layers), num_requests, num_tokens, top_k)
    return ids.permute(1, 2, 0, 3).numpy()


def lru_hit_rate(stream: np.ndarray, num_experts: int, num_slots: int, warm: int = 0) -> np.ndarray:
    """Plain per-layer LRU over one request's stream (T, L, k), batch 1: a routed expert is a
    hit when its layer holds it; misses evict the least recently used experts that this
    token does not use (ties: lowest expert id). Tokens before `warm` are not counted.
    Returns each layer's hit rate (L,)."""
    num_tokens, num_layers, top_k = stream.shape
    last = np.full((num_layers, num_experts), -1)
    resident = np.zeros((num_layers, num_experts), dtype=bool)
    layer = np.arange(num_layers)[:, None]
    hits = np.zeros(num_layers)
    for t in range(num_tokens):
        cur = stream[t]  # (L, k)
        hit = resident[layer, cur]
        if t >= warm:
            hits += hit.sum(1)
        need = resident.sum(1) + (~hit).sum(1) - num_slots  # (L,) evictions per layer
        if need.max() > 0:
            in_use = np.zeros_like(resident)
            in_use[layer, cur] = True
            score = np.where(resident & ~in_use, last, np.iinfo(np.int64).max)
            order = np.argsort(score, axis=1, kind="stable")
            rank = np.empty_like(order)
            np.put_along_axis(rank, order, np.arange(num_experts)[None, :], axis=1)
            resident &= ~(rank < need[:, None])
        resident[layer, cur] = True
        last[layer, cur] = t
    return hits / ((num_tokens - warm) * top_k)


def hit_curve(streams: np.ndarray, layer_weights: np.ndarray, num_experts: int,
              fractions: list[float], warm: int = 0) -> dict[float, float]:  # fmt: skip
    """LRU hit rate (percent) at round(f·E) slots per layer: the mean over requests of the
    layer-weighted mean (see `sampled_layers`)."""
    top_k = streams.shape[-1]
    out = {}
    for f in fractions:
        slots = max(top_k, round(f * num_experts))
        rates = [lru_hit_rate(s, num_experts, slots, warm) @ layer_weights for s in streams]
        out[f] = 100 * float(np.mean(rates))
    return out


def repeat_rate(streams: np.ndarray, layer_weights: np.ndarray) -> float:
    """Percent of a token's experts that the previous token (same layer) also chose."""
    a, b = streams[:, 1:], streams[:, :-1]  # (R, T-1, L, k)
    same = (a[..., :, None] == b[..., None, :]).any(-1)  # (R, T-1, L, k)
    return 100 * float(same.mean(axis=(0, 1, 3)) @ layer_weights)
