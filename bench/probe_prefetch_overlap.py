"""Can a prefetch fill hide behind a decode layer's compute, and with how many programs?

Cross-layer prefetch (issue 19, `offload/prefetch.py`) runs layer l + 1's predicted fills on
a side stream while layer l computes. It gained 1.03× at 35% bf16 (2026-12-05) with 16 fill
programs, and the replay of the compute slowed 3.34 → 4.06 ms a step: the fill shares the
SMs (and their memory queues) with the GEMVs it should hide behind, and too few programs
may not keep the link busy. Nobody has measured the two sides of that trade. This probe
does, for one layer's worth of each:

- compute: one decode layer's HBM-bound work at batch 1 (`--moe-calls` MoE GEMVs of top-8
  resident experts of the Qwen3-30B-A3B shape, then a 2048 → `--linear-out` GEMV), captured
  in a CUDA graph;
- fill: `--misses` experts of `--expert-mb` MB (default: a GPTQ int4 g128 expert of that
  shape, 2.43 MB) from the host store's mapped pinned memory into slots, by the fill kernel
  with P programs (`--programs`), or by the copy engine (one copy a tensor), in a graph.

Each runs alone, then both side by side (two streams, released together by one event after
a GPU spin, so neither waits on the CPU's launch). A row: the fill's µs and GB/s alone and
beside the compute, the compute's µs alone and beside the fill (its slowdown), the pair's
wall time, and the share of the shorter one hidden, (fill + compute − wall) ÷ min(fill,
compute). Bytes are checked first. GPU only.

Both sides run eagerly by default (`--eager compute,fill`; their launches are queued
behind the spin, so neither waits on the CPU): side by side, the first pair stopped with an
illegal memory access on the H100 with both sides graph replays (2026-12-06, twenty-second
session) and again with the compute a graph and the fill eager (twenty-third session), a
pair that had run clean before; compute-sanitizer, which serializes the kernels, found
nothing. Intermittent and not diagnosed; both eager never failed. The engine replays one
graph whose two streams passed every prefetch GPU test.

    python3 bench/probe_prefetch_overlap.py [--programs 8,16,32,66,132,264] [--misses 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench_offload_fill import graphed  # noqa: E402

from xinfer.kernels.moe_launch import fused_moe  # noqa: E402
from xinfer.offload import kernels as offload_kernels  # noqa: E402
from xinfer.offload.host_store import HostExpertStore  # noqa: E402
from xinfer.offload.slot_cache import SlotCache  # noqa: E402


def side_by_side(compute, fill, reps: int):
    """Median µs of (compute, fill, wall), two graph replays (`graphed`) released at one
    event on two streams (either may be None: the other is then timed alone; 0 for it)."""
    s_c, s_f = torch.cuda.Stream(), torch.cuda.Stream()
    rows = []
    for _ in range(reps):
        start, c_end, f_end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        with torch.cuda.stream(s_c):
            torch.cuda._sleep(1_000_000)  # ~0.5 ms: both streams are queued before `start`
            start.record(s_c)
            if compute is not None:
                compute()
            c_end.record(s_c)
        s_f.wait_event(start)
        with torch.cuda.stream(s_f):
            if fill is not None:
                fill()
            f_end.record(s_f)
        torch.cuda.synchronize()
        c_us, f_us = start.elapsed_time(c_end) * 1e3, start.elapsed_time(f_end) * 1e3
        c_us, f_us = (c_us if compute is not None else 0.0), (f_us if fill is not None else 0.0)
        rows.append((c_us, f_us, max(c_us, f_us)))
    return tuple(statistics.median(r[i] for r in rows) for i in range(3))


def build_compute(dev, hidden, inter, experts, moe_calls, linear_out, eager=False):
    """One decode layer's batch-1 HBM-bound work as a graph replay (`eager`: the function),
    and its bytes read."""
    gen = torch.Generator(device=dev).manual_seed(0)
    w13 = torch.randn(experts, 2 * inter, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
    w2 = torch.randn(experts, hidden, inter, device=dev, dtype=torch.bfloat16, generator=gen)
    lin = torch.randn(linear_out, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
    x = torch.randn(1, hidden, device=dev, dtype=torch.bfloat16, generator=gen) * 0.1
    ids = [torch.randperm(experts, device=dev, generator=gen)[:8].view(1, 8).int()
           for _ in range(moe_calls)]  # fmt: skip
    weights = torch.full((1, 8), 0.125, device=dev, dtype=torch.float32)

    def fn() -> None:
        h = x
        for i in range(moe_calls):
            h = fused_moe(h, ids[i], weights, w13, w2)
        torch.nn.functional.linear(h, lin)

    expert_bytes = (w13[0].numel() + w2[0].numel()) * 2
    return (fn if eager else graphed(fn)), moe_calls * 8 * expert_bytes + lin.numel() * 2


def build_fills(dev, expert_mb: float, misses: int, programs: list[int], eager=False):
    """Graph replays (`eager`: the functions) filling `misses` experts of `expert_mb` MB (fill
    kernel with each program count, then the copy engine), bytes checked; (label, callable)
    pairs and the bytes moved."""
    words = int(expert_mb * 1e6) // 4 // 1024 * 1024
    num = misses + 8
    host_t = torch.randint(-(2**31), 2**31 - 1, (num, words), dtype=torch.int32)
    store = HostExpertStore(dev)
    src = store.add_layer({"w": host_t})["w"]  # pinned after fill, mapped: as the engine's
    cache = SlotCache({"w": src}, misses, dev, num_overflow=0)
    cache.miss_ids[:misses].copy_(torch.arange(8, 8 + misses, dtype=torch.int32))
    cache.miss_slots[:misses].copy_(torch.arange(misses, dtype=torch.int32))
    cache.miss_count.fill_(misses)
    fills = []
    for p in programs:

        def kernel(p=p) -> None:
            offload_kernels.fill(cache, {"w": src}, num_programs=p)

        cache.slots["w"].zero_()
        kernel()
        torch.cuda.synchronize()
        assert torch.equal(cache.slots["w"][:misses].cpu(), host_t[8 : 8 + misses]), p
        fills.append((f"fill kernel, {p} programs", kernel if eager else graphed(kernel)))
    dst = cache.slots["w"]

    def engine() -> None:
        for m in range(misses):
            dst[m].copy_(src[8 + m], non_blocking=True)

    fills.append(("copy engine", engine if eager else graphed(engine)))
    return fills, misses * words * 4, store


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", default="8,16,32,66,132,264")
    ap.add_argument("--misses", default="1,2,4")
    ap.add_argument("--expert-mb", type=float, default=2.43, help="bytes an expert (GPTQ g128)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--moe-calls", type=int, default=2)
    ap.add_argument("--linear-out", type=int, default=5120)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None)
    ap.add_argument("--eager", default="compute,fill", choices=("", "fill", "compute", "compute,fill"),
                    help="which side runs eagerly instead of as a graph replay (see above)")  # fmt: skip
    return ap


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    dev = torch.device("cuda", torch.cuda.current_device())
    programs = [int(p) for p in args.programs.split(",")]
    eager = set(filter(None, args.eager.split(",")))
    compute, compute_bytes = build_compute(
        dev, args.hidden, args.inter, args.experts, args.moe_calls, args.linear_out,
        eager="compute" in eager,
    )  # fmt: skip
    c_alone = side_by_side(compute, None, args.reps)[0]
    print(f"# {torch.cuda.get_device_name(dev)}: compute alone {c_alone:.1f} µs "
          f"({compute_bytes / c_alone / 1e3:.2f} TB/s of HBM reads)", flush=True)  # fmt: skip
    print("| fill | MB | fill alone µs (GB/s) | beside the compute: fill µs (GB/s) | compute µs "
          "(× alone) | wall µs | hidden |\n|---|---|---|---|---|---|---|")  # fmt: skip
    rows = []
    for misses in (int(m) for m in args.misses.split(",")):
        fills, moved, store = build_fills(dev, args.expert_mb, misses, programs, "fill" in eager)
        for label, graph in fills:
            f_alone = side_by_side(None, graph, args.reps)[1]
            c_us, f_us, wall = side_by_side(compute, graph, args.reps)
            hidden = (f_alone + c_alone - wall) / min(f_alone, c_alone)
            row = {"fill": label, "mb": moved / 1e6, "fill_alone_us": f_alone,
                   "fill_together_us": f_us, "compute_alone_us": c_alone,
                   "compute_together_us": c_us, "wall_us": wall, "hidden": hidden}  # fmt: skip
            rows.append(row)
            print(f"| {label} | {moved / 1e6:.2f} | {f_alone:.1f} ({moved / f_alone / 1e3:.1f}) "
                  f"| {f_us:.1f} ({moved / f_us / 1e3:.1f}) | {c_us:.1f} ({c_us / c_alone:.2f}) "
                  f"| {wall:.1f} | {hidden:.0%} |", flush=True)  # fmt: skip
        store.close()
    if args.json:
        Path(args.json).write_text(
            json.dumps({"compute_alone_us": c_alone, "rows": rows}, indent=1)
        )
    return rows


if __name__ == "__main__":
    main()
