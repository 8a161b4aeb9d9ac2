"""Per-layer slot counts, simulated on the CPU (issue 19, item 3): would `auto` gain from
giving MoE layers different slot counts, chosen from their miss curves, at the same total?

    PYTHONPATH=src python3 bench/sim_layer_slots.py [--preset qwen3-30b-a3b] [--seeds 0,1,2]
        [--fractions 0.1,0.2,0.35,0.5] [--batches 1,8] [--calib-tokens 512]
        [--eval-tokens 1024] [--cache-warm 128] [--expert-mb 9.44]

The routing stream comes from the routing model (src/xinfer/routing/, the same torch
reference the CPU routing tests draw from): a model of L layers × E experts, top-k, whose
popularity z is fixed by the seed. Batch B = B requests decoding side by side, each with its
own drift c; one decode step is one call per layer over the B tokens (the union of their
experts, as the engine's lookup sees it).

The cache is the engine's lookup (offload/lookup.py) replayed exactly, vectorised over many
independent caches: per call the distinct experts in first-appearance order, hits stamp
their slot, misses take the unused slot of smallest (last use, slot index), and misses
beyond the free slots go to overflow rows without entering the tables. Hits and misses are
distinct experts per call (the engine's counters); every miss is one expert's bytes copied.

For every seed (= one model) and batch:
1. calibration: requests with keys 0.. draw `calib-tokens` decode tokens; every layer's miss
   curve (misses at each slot count S in [k, E]) is measured on it after `cache-warm` steps;
2. allocation per fraction f: (a) uniform, S = ceil(f·E) per layer as `auto`/a fraction
   gives today, total L·S; (b) greedy: every layer starts at k and each further slot goes to
   the layer whose curve (its lower convex hull) saves the most misses for it, up to the
   same total, at most E per layer; (c) greedy at the same device memory as (a): the two
   shared regions of E − S rows are sized by the layer with the fewest slots
   (offload/sizing.py), so a layer below the uniform S costs region rows, taken from the
   total; (d) greedy at the same total from another model's curves (seed + 100: another
   z, the same layer-scale ramp), how much of (b) a rule by layer depth alone would get;
3. evaluation on held-out requests (keys 1000.., the same model z, other drift and noise):
   `cache-warm` + `eval-tokens` steps, counted after the warm steps.

It prints per (batch, fraction) the hit rate and missed GB per token of (a), the changes of
(b), (c), (d) against it as mean [min, max] over the seeds, and the first seed's (b)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from xinfer.routing.config import PRESETS  # noqa: E402
from xinfer.routing.parametric import ParametricRouting  # noqa: E402
from xinfer.runner.forward_context import ForwardContext  # noqa: E402

EVAL_KEY_BASE = 1000  # request keys of the held-out stream (calibration uses 0..)
OTHER_SEED = 100  # the "another model" check fits on seed + OTHER_SEED (another z)


def draw_calls(preset: str, seed: int, num_layers: int, num_experts: int, top_k: int,
               batch: int, num_steps: int, first_key: int) -> np.ndarray:  # fmt: skip
    """(steps, L, batch·k) expert ids of `batch` requests (keys first_key..) decoding side by
    side: row t of layer l is the call's ids in the engine's order (request by request, each
    token's k ids in router order). Drawn as one prompt pass per request (the scan path; the
    decode path draws the same numbers: the noise is a function of key and position)."""
    source = ParametricRouting(PRESETS[preset], seed, [num_experts] * num_layers, batch, "cpu")
    i32 = dict(dtype=torch.int32)
    ctx = ForwardContext(
        slot_mapping=torch.zeros(batch * num_steps, dtype=torch.int64),
        block_tables=torch.zeros(batch, 1, **i32),
        seq_lens=torch.full((batch,), num_steps, **i32),
        query_start_loc=torch.arange(0, batch * num_steps + 1, num_steps, **i32),
        max_query_len=num_steps,
        max_seq_len=num_steps,
        request_rows=torch.arange(batch, dtype=torch.int64),
        request_keys=torch.arange(first_key, first_key + batch, dtype=torch.int64),
    )
    logits = torch.zeros(batch * num_steps, num_experts)
    ids = torch.stack([source.route(i, logits, ctx, top_k, True)[1] for i in range(num_layers)])
    ids = ids.reshape(num_layers, batch, num_steps, top_k).permute(2, 0, 1, 3)
    return ids.reshape(num_steps, num_layers, batch * top_k).numpy().astype(np.int64)


def first_appearance(ids: np.ndarray) -> np.ndarray:
    """(..., n) ids → bool mask of each id's first occurrence along the last axis."""
    n = ids.shape[-1]
    earlier = np.tril(np.ones((n, n), dtype=bool), k=-1)  # [j, i]: i < j
    return ~((ids[..., :, None] == ids[..., None, :]) & earlier).any(-1)


def simulate_lru(calls: np.ndarray, layer_of: np.ndarray, slots: np.ndarray, num_experts: int,
                 warm: int = 0) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Independent LRU caches over a stream of calls: cache c holds `slots[c]` experts and
    sees layer `layer_of[c]`'s ids, `calls` (steps, L, n). The rules of `lookup_reference`
    (module docstring). Returns (hits, misses) per cache: distinct experts per call, summed
    over the calls from `warm` on."""
    num_caches = len(layer_of)
    slots = np.asarray(slots, dtype=np.int64)
    if slots.min() < 1 or slots.max() > num_experts:
        raise ValueError(f"slots must lie in [1, {num_experts}]")
    width = int(slots.max())
    col = np.arange(width)
    exists = col[None, :] < slots[:, None]
    slot_of = np.full((num_caches, num_experts), -1, dtype=np.int64)
    expert_of = np.full((num_caches, width), -1, dtype=np.int64)
    last_use = np.full((num_caches, width), -1, dtype=np.int64)
    rows = np.arange(num_caches)[:, None]
    never = np.iinfo(np.int64).max
    hits = np.zeros(num_caches, dtype=np.int64)
    misses = np.zeros(num_caches, dtype=np.int64)
    for t in range(calls.shape[0]):
        ids = calls[t][layer_of]  # (C, n)
        first = first_appearance(calls[t])[layer_of]
        slot = slot_of[rows, ids]
        hit, miss = first & (slot >= 0), first & (slot < 0)
        hc, hj = np.nonzero(hit)
        last_use[hc, slot[hc, hj]] = t
        used = np.zeros((num_caches, width), dtype=bool)
        used[hc, slot[hc, hj]] = True
        num_hit, num_miss = hit.sum(1), miss.sum(1)
        num_lru = np.minimum(num_miss, slots - num_hit)  # the rest overflow
        if num_lru.max() > 0:
            score = np.where(used | ~exists, never, last_use * (width + 1) + col[None, :])
            order = np.argsort(score, axis=1, kind="stable")
            rank = np.cumsum(miss, axis=1) - 1  # each miss's place in first-appearance order
            mc, mj = np.nonzero(miss & (rank < num_lru[:, None]))
            victim = order[mc, rank[mc, mj]]
            old = expert_of[mc, victim]
            slot_of[mc[old >= 0], old[old >= 0]] = -1
            new = ids[mc, mj]
            expert_of[mc, victim] = new
            slot_of[mc, new] = victim
            last_use[mc, victim] = t
        if t >= warm:
            hits += num_hit
            misses += num_miss
    return hits, misses


def miss_curves(calls: np.ndarray, num_experts: int, top_k: int, warm: int) -> np.ndarray:
    """(L, E + 1) misses of each layer's LRU at every slot count S in [k, E] (one cache per
    (layer, S), simulated together); entries below k are NaN."""
    num_layers = calls.shape[1]
    sizes = np.arange(top_k, num_experts + 1)
    layer_of = np.repeat(np.arange(num_layers), len(sizes))
    _, misses = simulate_lru(calls, layer_of, np.tile(sizes, num_layers), num_experts, warm)
    curves = np.full((num_layers, num_experts + 1), np.nan)
    curves[:, top_k:] = misses.reshape(num_layers, len(sizes))
    return curves


def lower_hull(values: np.ndarray) -> np.ndarray:
    """The greatest convex minorant of a curve on 0..n-1 (piecewise linear, at every x)."""
    hull: list[int] = []
    for x in range(len(values)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # drop b when it lies on or above the chord from a to x
            if (values[b] - values[a]) * (x - a) >= (values[x] - values[a]) * (b - a):
                hull.pop()
            else:
                break
        hull.append(x)
    return np.interp(np.arange(len(values)), hull, values[hull])


def greedy_allocation(curves: np.ndarray, total: int, top_k: int) -> np.ndarray:
    """Slots per layer summing to `total`: every layer starts at k; each further slot goes to
    the layer whose miss curve (its lower convex hull, so a flat stretch of a noisy curve
    does not hide the gains after it) drops most for it; ties to the lower layer. At most
    E = curves.shape[1] - 1 per layer."""
    num_layers, width = curves.shape
    num_experts = width - 1
    if not num_layers * top_k <= total <= num_layers * num_experts:
        raise ValueError(f"total {total} is outside [{num_layers * top_k}, "
                         f"{num_layers * num_experts}] for {num_layers} layers")  # fmt: skip
    gains = np.empty((num_layers, num_experts - top_k))  # gain of slot S+1 over S, S >= k
    for layer in range(num_layers):
        hull = lower_hull(curves[layer, top_k:])
        gains[layer] = hull[:-1] - hull[1:]
    # Hull gains do not grow with S, so the best `total - L·k` gains overall are a prefix of
    # every layer's row: taking them is the greedy order (stable sort: lower layer first).
    order = np.argsort(-gains.reshape(-1), kind="stable")[: total - num_layers * top_k]
    extra = np.bincount(order // gains.shape[1], minlength=num_layers)
    return top_k + extra


def device_rows(slots: np.ndarray, num_experts: int) -> int:
    """Expert rows on the device for these slot counts: the slots plus the two shared regions
    of E − S rows, sized by the layer with the fewest slots (offload/sizing.py
    `device_bytes_for`, one expert size for every layer)."""
    return int(slots.sum()) + 2 * (num_experts - int(slots.min()))


def greedy_within_rows(curves: np.ndarray, rows: int, top_k: int) -> np.ndarray:
    """The greedy allocation of the largest total whose `device_rows` fit in `rows`: a
    smaller minimum widens the regions, so at equal device memory greedy gets fewer slots
    than uniform. (Greedy allocations only grow with the total, so the search walks down.)"""
    num_layers, num_experts = curves.shape[0], curves.shape[1] - 1
    for total in range(min(rows, num_layers * num_experts), num_layers * top_k - 1, -1):
        alloc = greedy_allocation(curves, total, top_k)
        if device_rows(alloc, num_experts) <= rows:
            return alloc
    raise ValueError(f"{rows} rows do not hold {top_k} slots in each of {num_layers} layers")


def uniform_slots(fraction: float, num_experts: int, top_k: int) -> int:
    """What a fixed fraction (and `auto` at the same budget) gives every layer today
    (offload/sizing.py `slots_for_fraction`)."""
    return min(num_experts, max(top_k, math.ceil(fraction * num_experts - 1e-9)))


def evaluate(calls: np.ndarray, allocations: list[np.ndarray], num_experts: int,
             warm: int) -> list[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """(hits, misses) per layer of each allocation over the same calls."""
    num_layers = calls.shape[1]
    layer_of = np.tile(np.arange(num_layers), len(allocations))
    hits, misses = simulate_lru(calls, layer_of, np.concatenate(allocations), num_experts, warm)
    return [(h, m) for h, m in zip(hits.reshape(-1, num_layers), misses.reshape(-1, num_layers))]


VARIANTS = ("uniform", "greedy", "greedy_rows", "greedy_other")


def run(args: argparse.Namespace) -> list[dict]:
    """Per (seed, batch, fraction): hit rate (%) and missed GB per token of every variant
    (`VARIANTS`: uniform; greedy at the same slot count; greedy at the same device rows,
    regions included; greedy from another model's curves (seed + OTHER_SEED), same slots)."""
    rows = []
    for seed in args.seeds:
        for batch in args.batches:
            t0 = time.time()
            dims = (args.layers, args.experts, args.top_k, batch)
            calib_steps = args.cache_warm + args.calib_tokens
            curves = miss_curves(draw_calls(args.preset, seed, *dims, calib_steps, 0),
                                 args.experts, args.top_k, args.cache_warm)  # fmt: skip
            other = miss_curves(draw_calls(args.preset, seed + OTHER_SEED, *dims, calib_steps, 0),
                                args.experts, args.top_k, args.cache_warm)  # fmt: skip
            held_out = draw_calls(
                args.preset, seed, *dims, args.cache_warm + args.eval_tokens, EVAL_KEY_BASE
            )
            allocs = []
            for f in args.fractions:
                uniform = np.full(args.layers, uniform_slots(f, args.experts, args.top_k))
                total = int(uniform.sum())
                allocs += [
                    uniform,
                    greedy_allocation(curves, total, args.top_k),
                    greedy_within_rows(curves, device_rows(uniform, args.experts), args.top_k),
                    greedy_allocation(other, total, args.top_k),
                ]
            results = evaluate(held_out, allocs, args.experts, args.cache_warm)
            tokens = args.eval_tokens * batch
            for i, f in enumerate(args.fractions):
                row = dict(seed=seed, batch=batch, fraction=f, slots=int(allocs[4 * i][0]))
                for j, name in enumerate(VARIANTS):
                    hits, misses = (int(x.sum()) for x in results[4 * i + j])
                    row[name] = dict(
                        hits=100 * hits / (hits + misses),
                        gb=misses * args.expert_mb / 1000 / tokens,
                        alloc=allocs[4 * i + j],
                    )
                rows.append(row)
            print(f"seed {seed} batch {batch}: {time.time() - t0:.0f} s", file=sys.stderr)
    return rows


def spread(values: list[float], digits: int = 1) -> str:
    """mean [min, max]"""
    return f"{np.mean(values):+.{digits}f} [{min(values):+.{digits}f}, {max(values):+.{digits}f}]"


def report(rows: list[dict], args: argparse.Namespace) -> list[str]:
    """A markdown table: means over seeds, changes against uniform as mean [min, max]."""
    lines = [
        "| batch | fraction (slots/layer) | uniform: hits | uniform: GB/token | "
        "greedy, same slots: missed bytes | hits, points | greedy, same device bytes: "
        "missed bytes | greedy from another model: missed bytes | greedy slots (first "
        "seed): layers 0-5; min-max of 6-47 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for batch in args.batches:
        for f in args.fractions:
            rs = [r for r in rows if r["batch"] == batch and r["fraction"] == f]

            def change(name: str, rs=rs) -> str:
                return spread([100 * (r[name]["gb"] / r["uniform"]["gb"] - 1) for r in rs]) + "%"

            points = [r["greedy"]["hits"] - r["uniform"]["hits"] for r in rs]
            a = rs[0]["greedy"]["alloc"]
            lines.append(
                f"| {batch} | {f} ({rs[0]['slots']}) | "
                f"{np.mean([r['uniform']['hits'] for r in rs]):.1f}% | "
                f"{np.mean([r['uniform']['gb'] for r in rs]):.3f} | {change('greedy')} | "
                f"{spread(points)} | {change('greedy_rows')} | {change('greedy_other')} | "
                f"{','.join(map(str, a[:6]))}; {a[6:].min()}-{a[6:].max()} |"
            )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(PRESETS))
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--fractions", default="0.1,0.2,0.35,0.5")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--calib-tokens", type=int, default=512)
    p.add_argument("--eval-tokens", type=int, default=1024)
    p.add_argument("--cache-warm", type=int, default=128)
    p.add_argument("--expert-mb", type=float, default=9.44, help="MB of one expert (bf16)")
    args = p.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.fractions = [float(f) for f in args.fractions.split(",")]
    args.batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(1)
    print("\n".join(report(run(args), args)))


if __name__ == "__main__":
    main()
