"""The slot policies (`--moe-offload-policy lru|lfu`) on a routing stream, simulated on the
CPU with the engine's own lookup twin (offload/lookup.py `lookup_reference`): hit rate per
expert fraction, every layer its own cache, call by call as the engine's lookup sees them.

    PYTHONPATH=src python3 bench/sim_slot_policy.py [--preset qwen3-30b-a3b] [--batch 1]
        [--shape L,E,K] [--fractions 0.1,0.2,0.35,0.5] [--warm 128] [--steps 384] [--seed 0]
    PYTHONPATH=src python3 bench/sim_slot_policy.py --trace routing.xrt [--decode-only]

The stream is either a routing model's (`sim_layer_slots.draw_calls`: one call per layer
and step over the batch's tokens; the model the benchmarks with dummy weights use; layer
shapes: Qwen3-30B-A3B 48 × 128, Qwen3.5 40 × 256, OLMoE 16 × 64; top-8) or a trace written
by `--record-routing` (routing/trace.py): every recorded step is one call per layer over
its tokens (`--decode-only`: only the steps in which every request decodes one token —
long prompts run as prompt passes, which stream a layer instead of looking it up). Hits
are counted after `--warm` calls of each layer."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from sim_layer_slots import draw_calls  # noqa: E402

from xinfer.config import OFFLOAD_POLICIES as POLICIES  # noqa: E402
from xinfer.offload.lookup import lookup_reference  # noqa: E402
from xinfer.offload.slot_cache import HITS, MISSES, SlotCache  # noqa: E402
from xinfer.routing.trace import read_trace  # noqa: E402

SHAPES = {"qwen3.5-35b-a3b": (40, 256), "qwen3.6-35b-a3b": (40, 256), "olmoe": (16, 64)}
DEFAULT_SHAPE = (48, 128)  # Qwen3-30B-A3B (and the uniform preset)


def model_calls(
    preset: str, batch: int, steps: int, seed: int, shape: tuple[int, int, int] | None = None
) -> tuple[list[np.ndarray], int]:
    """A routing model's stream: per step an (L, batch·k) array of ids; and E. `shape`
    (layers, experts, top-k) replaces the preset's own (e.g. Qwen1.5-MoE-A2.7B, 24 × 60
    top-4, which the benchmarks route with the qwen3-30b-a3b preset)."""
    layers, experts, top_k = shape or (*SHAPES.get(preset, DEFAULT_SHAPE), 8)
    calls = draw_calls(preset, seed, layers, experts, top_k, batch, steps, 1000)
    return list(calls), experts


def trace_calls(path: str, decode_only: bool) -> tuple[list[np.ndarray], int]:
    """A recorded trace's stream: per step an (L, T·k) array of ids; and E."""
    header, steps = read_trace(path)
    calls = []
    for st in steps:
        if decode_only and any(count != 1 for _, _, count in st.requests):
            continue
        calls.append(st.ids.astype(np.int64).reshape(header.num_layers, -1))
    return calls, header.num_experts


def hit_rates(calls: list[np.ndarray], num_experts: int, top_k: int, fractions: list[float],
              warm: int) -> dict[float, dict[str, float]]:  # fmt: skip
    """fraction → policy → hit rate (distinct experts a call, after `warm` calls)."""
    num_layers = calls[0].shape[0] if calls else 0
    out: dict[float, dict[str, float]] = {}
    for fraction in fractions:
        slots = min(num_experts, max(top_k, math.ceil(fraction * num_experts - 1e-9)))
        out[fraction] = {}
        for policy in POLICIES:
            hits = misses = 0
            for layer in range(num_layers):
                cache = SlotCache({"w": torch.zeros(num_experts, 1)}, slots,
                                  torch.device("cpu"), policy=policy)  # fmt: skip
                for t, call in enumerate(calls):
                    if t == warm:
                        cache.counters.zero_()
                    lookup_reference(cache, torch.from_numpy(call[layer]).view(1, -1))
                hits += int(cache.counters[HITS])
                misses += int(cache.counters[MISSES])
            out[fraction][policy] = hits / max(1, hits + misses)
    return out


def table(title: str, rates: dict[float, dict[str, float]]) -> list[str]:
    lines = [f"| {title} | " + " | ".join(POLICIES) + " | missed bytes |",
             "|---|" + "---|" * (len(POLICIES) + 1)]  # fmt: skip
    for fraction, by_policy in rates.items():
        cells = " | ".join(f"{100 * by_policy[p]:.1f}%" for p in POLICIES)
        change = (1 - by_policy["lfu"]) / max(1e-12, 1 - by_policy["lru"]) - 1
        lines.append(f"| {fraction:g} | {cells} | {100 * change:+.0f}% |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--trace", default=None, help="a --record-routing file instead of a preset")
    ap.add_argument("--decode-only", action="store_true", help="with --trace: decode steps only")
    ap.add_argument("--top-k", type=int, default=None, help="with --trace: its header's")
    ap.add_argument("--shape", default=None, metavar="L,E,K",
                    help="layers, experts, top-k instead of the preset's (e.g. 24,60,4)")  # fmt: skip
    ap.add_argument("--fractions", default="0.1,0.2,0.35,0.5")
    ap.add_argument("--warm", type=int, default=128)
    ap.add_argument("--steps", type=int, default=384)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    if args.trace:
        calls, experts = trace_calls(args.trace, args.decode_only)
        top_k = args.top_k or read_trace(args.trace)[0].top_k
        title = f"{Path(args.trace).name}{', decode steps' if args.decode_only else ''}"
    else:
        shape = tuple(int(v) for v in args.shape.split(",")) if args.shape else None
        if shape is not None and len(shape) != 3:
            raise SystemExit(f"--shape takes layers,experts,top-k, got {args.shape!r}")
        steps = args.warm + args.steps
        calls, experts = model_calls(args.preset, args.batch, steps, args.seed, shape)
        top_k = shape[2] if shape else 8
        title = f"{args.preset}{f' on {args.shape}' if shape else ''}, batch {args.batch}"
    if len(calls) <= args.warm:
        raise SystemExit(f"the stream has {len(calls)} calls, not more than --warm {args.warm}")
    print("\n".join(table(title, hit_rates(calls, experts, top_k, fractions, args.warm))))


if __name__ == "__main__":
    main()
