"""Per-kernel GPU time of a Chrome trace written by torch.profiler (e.g. `bench_decode.py
--trace` or `bench_offload_decode.py --trace-dir`), divided by the number of traced steps:

    python3 bench/trace_summary.py trace.json.gz --steps 4

Prints each kernel's milliseconds and launches per step, the GPU's busy time per step and
the span from the first kernel's start to the last kernel's end (busy ÷ span = how much of
the step the GPU was working rather than waiting between kernels)."""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path


def load_kernels(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]


def summarize(kernels: list[dict], steps: int, top: int) -> list[str]:
    per_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for e in kernels:
        row = per_name[e["name"][:60]]
        row[0] += e["dur"] / steps
        row[1] += 1 / steps
    busy = sum(e["dur"] for e in kernels) / steps
    start = min(e["ts"] for e in kernels)
    span = (max(e["ts"] + e["dur"] for e in kernels) - start) / steps
    lines = ["| kernel | ms per step | launches per step |", "|---|---|---|"]
    for name, (us, count) in sorted(per_name.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| {name} | {us / 1e3:.3f} | {count:g} |")
    lines.append(f"\nGPU busy {busy / 1e3:.3f} ms of a {span / 1e3:.3f} ms span per step")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--steps", type=int, default=4, help="decode steps in the trace")
    ap.add_argument("--top", type=int, default=16)
    args = ap.parse_args()
    kernels = load_kernels(args.trace)
    if not kernels:
        raise SystemExit(f"{args.trace}: no GPU kernel events")
    print("\n".join(summarize(kernels, args.steps, args.top)))


if __name__ == "__main__":
    main()
