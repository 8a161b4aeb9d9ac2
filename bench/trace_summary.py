"""Per-kernel GPU time of a Chrome trace written by torch.profiler (e.g. `bench_decode.py
--trace` or `bench_offload_decode.py --trace-dir`), divided by the number of traced steps:

    python3 bench/trace_summary.py trace.json.gz --steps 4

Prints each kernel's milliseconds and launches per step, the GPU's busy time per step and
the span from the first kernel's start to the last kernel's end (busy ÷ span = how much of
the step the GPU was working rather than waiting between kernels). `--beside fill_kernel`
adds each kernel's median time alone and while it overlapped a kernel of that name longer
than `--beside-min-us` (how much a concurrent branch, e.g. a prefetch fill, slows it):

    python3 bench/trace_summary.py trace.json.gz --beside fill_kernel

`--streams` adds each CUDA stream's busy time and top kernels per step, and the busiest
stream's idle gaps by the pair of kernels around them: where the main stream waits (e.g.
between a layer's routing and its lookup, for that layer's prefetch on a side stream).

    python3 bench/trace_summary.py trace.json.gz --streams

`--chain` charges each kernel the time from its predecessor's end to its own end: with
programmatic dependent launch (on by default) a kernel's own duration includes its wait
for the kernel before it, so durations overlap and only this view adds up to the step."""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import statistics
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


def beside(kernels: list[dict], other: str, min_us: float = 20.0) -> list[str]:
    """Per kernel name (not `other`): median µs alone and while overlapping an `other` kernel
    of at least `min_us`, with counts."""
    others = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in kernels if e["name"] == other and e["dur"] >= min_us
    )  # fmt: skip
    times: dict[str, tuple[list, list]] = collections.defaultdict(lambda: ([], []))
    for e in kernels:
        if e["name"] == other:
            continue
        start, end = e["ts"], e["ts"] + e["dur"]
        hit = any(s < end and start < t for s, t in others)
        times[e["name"][:60]][1 if hit else 0].append(e["dur"])
    lines = [f"| kernel | alone µs (n) | beside {other} µs (n) |", "|---|---|---|"]
    for name, (alone, near) in sorted(times.items(), key=lambda kv: -len(kv[1][1])):
        if near:
            lines.append(
                f"| {name} | {_median(alone)} ({len(alone)}) | {_median(near)} ({len(near)}) |"
            )
    return lines


def streams(kernels: list[dict], steps: int, top: int = 4, gaps: int = 6) -> list[str]:
    """Per stream (`args.stream` of each kernel event): ms busy and launches per step and its
    `top` kernels; then the idle gaps of the stream with the most launches (the main one),
    summed per step by (kernel before, kernel after), the `gaps` largest."""
    by_stream: dict = collections.defaultdict(list)
    for e in kernels:
        by_stream[e.get("args", {}).get("stream")].append(e)
    lines = ["| stream | busy ms per step | launches per step | top kernels (ms per step) |",
             "|---|---|---|---|"]  # fmt: skip
    for stream, events in sorted(by_stream.items(), key=lambda kv: -len(kv[1])):
        per_name: dict[str, float] = collections.Counter()
        for e in events:
            per_name[e["name"][:40]] += e["dur"] / steps / 1e3
        busy = sum(per_name.values())
        tops = ", ".join(f"{n} {ms:.3f}" for n, ms in per_name.most_common(top))
        lines.append(f"| {stream} | {busy:.3f} | {len(events) / steps:g} | {tops} |")
    main = sorted(max(by_stream.values(), key=len), key=lambda e: e["ts"])
    idle: dict[tuple[str, str], float] = collections.Counter()
    for before, after in zip(main, main[1:]):
        gap = after["ts"] - (before["ts"] + before["dur"])
        if gap > 0:
            idle[(before["name"][:40], after["name"][:40])] += gap / steps / 1e3
    lines += [
        f"\nbusiest stream idle {sum(idle.values()):.3f} ms per step; the largest gaps:",
        "| kernel before | kernel after | idle ms per step |",
        "|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {ms:.3f} |" for (a, b), ms in idle.most_common(gaps)]
    return lines


def chain(kernels: list[dict], steps: int, top: int) -> list[str]:
    """Per kernel name: ms per step from the end of the kernel before it on its stream to its
    own end, and the median of that a launch. Under programmatic dependent launch (PDL, on by
    default) a kernel starts while its producer still runs and waits on the device, so its
    own duration counts that wait and the durations sum past the span; ends are what PDL
    does not move. The charges add up to the span from the first kernel's end."""
    by_stream: dict = collections.defaultdict(list)
    for e in kernels:
        by_stream[e.get("args", {}).get("stream")].append(e)
    charged: dict[str, list[float]] = collections.defaultdict(list)
    for events in by_stream.values():
        ordered = sorted(events, key=lambda e: e["ts"] + e["dur"])
        for before, e in zip(ordered, ordered[1:]):
            start = max(e["ts"], before["ts"] + before["dur"])
            charged[e["name"][:60]].append(e["ts"] + e["dur"] - start)
    total = sum(sum(v) for v in charged.values()) / steps
    lines = ["| kernel | ms per step, end to end | median µs a launch | launches per step |",
             "|---|---|---|---|"]  # fmt: skip
    ranked = sorted(charged.items(), key=lambda kv: -sum(kv[1]))[:top]
    for name, us in ranked:
        lines.append(
            f"| {name} | {sum(us) / steps / 1e3:.3f} | {_median(us)} | {len(us) / steps:g} |"
        )
    lines.append(f"\ncharged {total / 1e3:.3f} ms per step (end to end)")
    return lines


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "—"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--steps", type=int, default=4, help="decode steps in the trace")
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--beside", default=None, help="a kernel name, e.g. fill_kernel")
    ap.add_argument("--beside-min-us", type=float, default=20.0)
    ap.add_argument("--streams", action="store_true", help="per stream, and the main's gaps")
    ap.add_argument("--chain", action="store_true", help="each kernel from its predecessor's end")
    args = ap.parse_args()
    kernels = load_kernels(args.trace)
    if not kernels:
        raise SystemExit(f"{args.trace}: no GPU kernel events")
    print("\n".join(summarize(kernels, args.steps, args.top)))
    if args.beside:
        print("\n" + "\n".join(beside(kernels, args.beside, args.beside_min_us)))
    if args.streams:
        print("\n" + "\n".join(streams(kernels, args.steps)))
    if args.chain:
        print("\n" + "\n".join(chain(kernels, args.steps, args.top)))


if __name__ == "__main__":
    main()
