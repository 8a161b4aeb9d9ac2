"""The slot policies (`--moe-offload-policy lru|lfu`) on a routing model's stream, simulated
on the CPU with the engine's own lookup twin (offload/lookup.py `lookup_reference`): hit
rate per expert fraction, every layer its own cache, as a decode batch sees them.

    PYTHONPATH=src python3 bench/sim_slot_policy.py [--preset qwen3-30b-a3b] [--batch 1]
        [--fractions 0.1,0.2,0.35,0.5] [--warm 128] [--steps 384] [--seed 0]

The stream is `sim_layer_slots.draw_calls` (one call per layer and step over the batch's
tokens; the same routing model the benchmarks with dummy weights use). Hits are counted
after `--warm` steps. The layer shape follows the preset's model (Qwen3-30B-A3B: 48 × 128,
Qwen3.5: 40 × 256, OLMoE: 16 × 64; top-8)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from sim_layer_slots import draw_calls  # noqa: E402

from xinfer.offload.lookup import lookup_reference  # noqa: E402
from xinfer.offload.slot_cache import HITS, MISSES, POLICIES, SlotCache  # noqa: E402

SHAPES = {"qwen3.5-35b-a3b": (40, 256), "qwen3.6-35b-a3b": (40, 256), "olmoe": (16, 64)}
DEFAULT_SHAPE = (48, 128)  # Qwen3-30B-A3B (and the uniform preset)


def hit_rates(preset: str, batch: int, fractions: list[float], warm: int, steps: int,
              seed: int) -> dict[float, dict[str, float]]:  # fmt: skip
    """fraction → policy → hit rate (distinct experts a call, after `warm` steps)."""
    layers, experts = SHAPES.get(preset, DEFAULT_SHAPE)
    top_k = 8
    calls = torch.from_numpy(draw_calls(preset, seed, layers, experts, top_k, batch,
                                        warm + steps, 1000))  # fmt: skip
    out: dict[float, dict[str, float]] = {}
    for fraction in fractions:
        slots = min(experts, max(top_k, math.ceil(fraction * experts - 1e-9)))
        out[fraction] = {}
        for policy in POLICIES:
            hits = misses = 0
            for layer in range(layers):
                cache = SlotCache({"w": torch.zeros(experts, 1)}, slots, torch.device("cpu"),
                                  policy=policy)  # fmt: skip
                for t in range(warm + steps):
                    if t == warm:
                        cache.counters.zero_()
                    lookup_reference(cache, calls[t, layer].view(1, -1))
                hits += int(cache.counters[HITS])
                misses += int(cache.counters[MISSES])
            out[fraction][policy] = hits / max(1, hits + misses)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--fractions", default="0.1,0.2,0.35,0.5")
    ap.add_argument("--warm", type=int, default=128)
    ap.add_argument("--steps", type=int, default=384)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    rates = hit_rates(args.preset, args.batch, fractions, args.warm, args.steps, args.seed)
    print(f"| {args.preset}, batch {args.batch} | " + " | ".join(POLICIES) + " | missed bytes |")
    print("|---|" + "---|" * (len(POLICIES) + 1))
    for fraction, by_policy in rates.items():
        cells = " | ".join(f"{100 * by_policy[p]:.1f}%" for p in POLICIES)
        change = (1 - by_policy["lfu"]) / (1 - by_policy["lru"]) - 1
        print(f"| {fraction:g} | {cells} | {100 * change:+.0f}% |")


if __name__ == "__main__":
    main()
