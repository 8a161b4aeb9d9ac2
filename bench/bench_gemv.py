"""Benchmark of the Triton skinny GEMM (`gemv_launch.linear`) against cuBLAS (F.linear) on
the decode-sized linears (M = 1, 8, 16 rows, bf16, no bias) of Qwen3-30B-A3B,
Qwen1.5-MoE-A2.7B and Qwen3.5-35B-A3B, plus a 151936-row LM head. CUDA only.

1. Checks `kernels.linear` (the dispatch, with the current GEMV_TABLE) against F.linear for
   every shape and M, and that its rows do not depend on M (bitwise).
2. Sweeps the candidate tile configs (each checked against F.linear once). Every config is
   compiled first, in parallel processes that fill Triton's on-disk cache (--jobs).
3. Prints per shape and M: cuBLAS, the current table and the best candidate, in us and TB/s of
   weight bytes; then the GEMV_TABLE entries to paste into src/xinfer/kernels/gemv_launch.py
   (per shape: one split_k for all M, the best config per M under that rule, or None where
   cuBLAS is faster summed over the M's).

Timing: `calls` launches captured in one CUDA graph (48, or more so that the rotated weight
copies span 2x the L2 cache and every call reads its weight from HBM, as in a decode step),
replayed and timed with CUDA events: host launch overhead is not counted.

    python bench/bench_gemv.py                  # check + sweep + table (about a minute)
    python bench/bench_gemv.py --no-sweep       # check + current table vs cuBLAS only
    python bench/bench_gemv.py --shapes qwen3.qkv,qwen3.router --ms 1,16
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.nn.functional as F
import triton
from cuda_timing import cuda_seconds, device_copy_bandwidth  # noqa: E402

from xinfer import kernels
from xinfer.kernels import gemv_launch as gl

DEV = "cuda"
SHAPES = {  # name: (N, K) of the weight
    "qwen3.qkv": (5120, 2048),
    "qwen3.o_proj": (2048, 4096),
    "qwen3.router": (128, 2048),
    "lm_head": (151936, 2048),
    "qwen15.qkv": (6144, 2048),
    "qwen15.o_proj": (2048, 2048),
    "qwen15.shared_gate_up": (11264, 2048),
    "qwen15.shared_down": (2048, 5632),
    "qwen15.router": (60, 2048),
    "qwen15.shared_gate": (1, 2048),
    # Qwen3.5-35B-A3B: linear attention's qkvz and ba, full attention's qkv (with its output
    # gate), router, shared-expert gate_up and down, LM head of the 248,320-token vocabulary
    # (out_proj / o_proj are qwen3.o_proj's shape)
    "qwen35.qkvz": (12288, 2048),
    "qwen35.ba": (64, 2048),
    "qwen35.qkv": (9216, 2048),
    "qwen35.router": (256, 2048),
    "qwen35.shared_gate_up": (1024, 2048),
    "qwen35.shared_down": (2048, 512),
    "qwen35.lm_head": (248320, 2048),
}
TILES = [  # (block_n, block_k, num_warps, num_stages)
    (16, 256, 4, 4), (16, 512, 4, 3), (16, 1024, 8, 2),
    (32, 128, 4, 4), (32, 256, 4, 3), (32, 256, 4, 4), (32, 256, 8, 4), (32, 512, 4, 3),
    (32, 512, 8, 3), (64, 128, 4, 4), (64, 128, 4, 6), (64, 256, 4, 3), (64, 256, 8, 4),
    (64, 512, 8, 2), (128, 128, 8, 4), (128, 256, 8, 3),
]  # fmt: skip
SPLITS = (1, 2, 4, 8)
GRAPH_CALLS = 48
MAX_COPIES = 512


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names")
    p.add_argument("--ms", default="1,8,16", help="batch rows; the largest is the 16 bucket")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--reps", type=int, default=5, help="graph replays per measurement")
    p.add_argument("--jobs", type=int, default=16, help="compile processes (1: compile inline)")
    p.add_argument("--no-sweep", action="store_true", help="time the current table only")
    return p.parse_args()


def candidates(n: int, k: int, num_sms: int) -> list[gl.GemvConfig]:
    """TILES no wider than N, each without split-K, and with 2/4/8 splits where the N tiles
    alone leave SMs idle, and each split is non-empty and at least BLOCK_K wide."""
    out = []
    for bn, bk, nw, ns in TILES:
        if bn > max(16, triton.next_power_of_2(n)):
            continue
        for split in SPLITS:
            k_per_split = triton.cdiv(triton.cdiv(k, split), gl.SPLIT_ALIGN) * gl.SPLIT_ALIGN
            usable = triton.cdiv(n, bn) < num_sms and k_per_split >= bk
            if split == 1 or (usable and triton.cdiv(k, k_per_split) == split):
                out.append(gl.GemvConfig(bn, bk, nw, ns, split))
    return out


def describe(cfg: gl.GemvConfig | None) -> str:
    if cfg is None:
        return "None"
    text = f"C(block_n={cfg.block_n}, block_k={cfg.block_k}, num_warps={cfg.num_warps}, "
    text += f"num_stages={cfg.num_stages}"
    return text + (f", split_k={cfg.split_k})" if cfg.split_k > 1 else ")")


# ---- checks ---------------------------------------------------------------------------------


def close(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """Equal or an ulp apart: both accumulate in float32 and round once."""
    out, ref = out.float(), ref.float()
    err = (out - ref).abs().max().item()
    return err <= 1e-2 * ref.abs().max().item() and (out - ref).norm() <= 5e-3 * ref.norm()


def check_dispatch(names: list[str], ms: list[int], dtype: torch.dtype) -> None:
    for name in names:
        n, k = SHAPES[name]
        g = torch.Generator(DEV).manual_seed(n)
        w = (torch.randn(n, k, generator=g, device=DEV) / k**0.5).to(dtype)
        x = torch.randn(16, k, generator=g, device=DEV).to(dtype)
        full = kernels.linear(x, w)
        ok = all(close(kernels.linear(x[:m], w), F.linear(x[:m], w)) for m in ms)
        invariant = all(torch.equal(kernels.linear(x[:m], w), full[:m]) for m in range(1, 16))
        path = "triton" if gl.wants(x, w, None) else "cuBLAS"
        print(f"check {name:22s} ({path}): vs F.linear {'ok' if ok else 'MISMATCH'}, "
              f"rows independent of M {'ok' if invariant else 'NO'}")  # fmt: skip
        if not (ok and invariant):
            sys.exit("kernels.linear is wrong for this shape; not benchmarking")


# ---- compiling ------------------------------------------------------------------------------


def compile_work(names: list[str], ms: list[int], dtype, sweep: bool, num_sms: int) -> dict:
    """Config -> the (N, K) it will run on: the table's picks, plus the candidates if sweeping."""
    work: dict[gl.GemvConfig, list[tuple[int, int]]] = {}
    for name in names:
        n, k = SHAPES[name]
        cfgs = {gl.select(n, k, m, dtype) for m in ms} - {None}
        for cfg in cfgs | (set(candidates(n, k, num_sms)) if sweep else set()):
            work.setdefault(cfg, []).append((n, k))
    return work


def _compile_configs(work: list[tuple[gl.GemvConfig, list[tuple[int, int]]]], dtype: str):
    """Worker: run each config once per shape (torch.empty weights), which compiles it into
    Triton's on-disk cache. Returns (config, error) of those that fail."""
    dtype = getattr(torch, dtype)
    failed = []
    for cfg, shapes in work:
        for n, k in shapes:
            x = torch.zeros(1, k, device=DEV, dtype=dtype)
            try:
                gl.linear(x, torch.empty(n, k, device=DEV, dtype=dtype), config=cfg)
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: report, skip
                failed.append((cfg, f"{type(e).__name__}: {str(e)[:80]}"))
                break
    torch.cuda.synchronize()
    return failed


def precompile(work: dict, dtype: str, jobs: int) -> None:
    """Compile `work` in `jobs` processes; later launches load the kernels from disk."""
    items = sorted(work.items(), key=lambda item: str(item[0]))
    groups = [items[i::jobs] for i in range(jobs)]
    start = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        failed = [f for group in pool.map(_compile_configs, groups, [dtype] * jobs) for f in group]
    print(f"compiled {len(items)} configs in {time.perf_counter() - start:.0f} s "
          f"({jobs} processes)")  # fmt: skip
    for cfg, why in failed:
        print(f"  failed: {describe(cfg)}: {why}")


# ---- timing ---------------------------------------------------------------------------------


def graph_seconds(launch, calls: int, reps: int) -> float:
    """Seconds per launch: launch(0..calls-1) captured in one CUDA graph and replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch(0)  # compiles or loads the kernel outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            launch(i)
    return cuda_seconds(graph.replay, reps) / calls


class ShapeBench:
    """Rotating weight copies of one (N, K) and the M x K inputs; times F.linear or a config."""

    def __init__(self, n: int, k: int, dtype: torch.dtype, reps: int) -> None:
        self.n, self.k, self.reps = n, k, reps
        self.nbytes = n * k * dtype.itemsize
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        count = min(MAX_COPIES, math.ceil(2 * l2 / self.nbytes))
        g = torch.Generator(DEV).manual_seed(k)
        self.weights = [
            (torch.randn(n, k, generator=g, device=DEV) / k**0.5).to(dtype) for _ in range(count)
        ]
        self.calls = max(count, min(GRAPH_CALLS, math.ceil(2**31 / self.nbytes)))
        self.x = torch.randn(16, k, generator=g, device=DEV).to(dtype)

    def seconds(self, m: int, cfg: gl.GemvConfig | None | str) -> float:
        """cfg "cublas": F.linear; "table": the dispatch's choice; else that config."""
        x, ws = self.x[:m], self.weights
        if cfg == "cublas":
            launch = lambda i: F.linear(x, ws[i % len(ws)])
        elif cfg == "table":
            launch = lambda i: kernels.linear(x, ws[i % len(ws)])
        else:
            launch = lambda i: gl.linear(x, ws[i % len(ws)], config=cfg)
        return graph_seconds(launch, self.calls, self.reps)

    def correct(self, cfg: gl.GemvConfig) -> bool:
        w = self.weights[0]
        return close(gl.linear(self.x, w, config=cfg), F.linear(self.x, w))


def recommend(
    ms: list[int], cublas: dict[int, float], results: dict[int, dict[gl.GemvConfig, float]]
) -> dict[int, gl.GemvConfig | None]:
    """Per M the fastest config among those of one split_k (the split_k with the least time
    summed over the M's), or None for every M if cuBLAS's sum is lower: the table's rule."""
    best_total, best = sum(cublas.values()), dict.fromkeys(ms)
    for split in sorted({c.split_k for r in results.values() for c in r}):
        options = [{c: t for c, t in results[m].items() if c.split_k == split} for m in ms]
        if not all(options):
            continue
        pick = {m: min(opt, key=opt.get) for m, opt in zip(ms, options)}
        total = sum(results[m][pick[m]] for m in ms)
        if total < best_total:
            best_total, best = total, pick
    return best


def sweep_shape(bench: ShapeBench, ms: list[int], num_sms: int):
    """(per-M times of every correct candidate, the names of those that disagree)."""
    results: dict[int, dict[gl.GemvConfig, float]] = {m: {} for m in ms}
    wrong = []
    for cfg in candidates(bench.n, bench.k, num_sms):
        try:
            if not bench.correct(cfg):
                wrong.append(describe(cfg))
                continue
            for m in ms:
                results[m][cfg] = bench.seconds(m, cfg)
        except Exception as e:  # noqa: BLE001 - a config that does not compile or fit
            print(f"  skipping {describe(cfg)}: {type(e).__name__}")
    return results, wrong


def table_entries(name: str, n: int, k: int, ms: list[int], pick: dict) -> list[str]:
    """GEMV_TABLE lines: one per run of equal configs, keyed by its largest M (the last 16)."""
    lines, bounds = [], [*ms[:-1], gl.MAX_M]
    for i, m in enumerate(ms):
        if i + 1 < len(ms) and pick[ms[i + 1]] == pick[m]:
            continue
        lines.append(f"    ({n}, {k}, {bounds[i]}): {describe(pick[m])},  # {name}")
    return lines


def bench_shape(name, ms, dtype, args, num_sms, entries: list[str]) -> list[tuple]:
    """Rows (name, M, weight bytes, cuBLAS s, table s, pick s, pick) of one shape; appends
    its GEMV_TABLE lines to `entries` when sweeping (else the pick is the table's config)."""
    n, k = SHAPES[name]
    bench = ShapeBench(n, k, dtype, args.reps)
    print(f"\n{name}: N={n} K={k}, {bench.nbytes / 1e6:.1f} MB, {bench.calls} calls per graph, "
          f"{len(bench.weights)} weight copies")  # fmt: skip
    cublas = {m: bench.seconds(m, "cublas") for m in ms}
    table = {m: bench.seconds(m, "table") for m in ms}
    if args.no_sweep:
        pick = {m: gl.select(n, k, m, dtype) for m in ms}
        best = {m: table[m] if pick[m] else cublas[m] for m in ms}
    else:
        results, wrong = sweep_shape(bench, ms, num_sms)
        for cfg in wrong:
            print(f"  MISMATCH vs F.linear, excluded: {cfg}")
        pick = recommend(ms, cublas, results)
        best = {m: results[m][pick[m]] if pick[m] else cublas[m] for m in ms}
        entries += table_entries(name, n, k, ms, pick)
    rows = []
    for m in ms:
        desc = describe(pick[m]) if pick[m] else "cuBLAS"
        rows.append((name, m, bench.nbytes, cublas[m], table[m], best[m], desc))
        print(f"  M={m:2d}: cuBLAS {cublas[m] * 1e6:6.2f} us | table {table[m] * 1e6:6.2f} us | "
              f"pick {best[m] * 1e6:6.2f} us {bench.nbytes / best[m] / 1e12:4.2f} TB/s  {desc}")  # fmt: skip
    return rows


def print_table(rows: list[tuple], swept: bool) -> None:
    """cuBLAS, the current table and (after a sweep) the pick: us and TB/s of weight bytes;
    the speed-up over cuBLAS is that of the pick, or of the table without a sweep."""
    cols = ["cuBLAS", "table", "pick"][: 3 if swept else 2]
    print(f"{'shape':22s} {'M':>2s} " + " ".join(f"{c + ' us':>9s} {'TB/s':>5s}" for c in cols)
          + f" {'x cuBLAS':>8s}  {cols[-1]}")  # fmt: skip
    for name, m, nbytes, *secs, desc in rows:
        secs = secs[: len(cols)]
        cells = " ".join(f"{sec * 1e6:9.2f} {nbytes / sec / 1e12:5.2f}" for sec in secs)
        print(f"{name:22s} {m:2d} {cells} {secs[0] / secs[-1]:8.2f}  {desc}")


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gemv.py needs a CUDA GPU")
    dtype = getattr(torch, args.dtype)
    names = [s for s in args.shapes.split(",") if s]
    ms = sorted(int(m) for m in args.ms.split(",") if m)
    if not names or any(s not in SHAPES for s in names) or not 1 <= ms[0] <= ms[-1] <= 16:
        sys.exit(f"shapes must be among {', '.join(SHAPES)}; M in 1..16")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    start = time.perf_counter()
    if args.jobs > 1:
        work = compile_work(names, ms, dtype, not args.no_sweep, num_sms)
        precompile(work, args.dtype, args.jobs)
    check_dispatch(names, ms, dtype)
    copy_bw = device_copy_bandwidth()
    rows, entries = [], []
    for name in names:
        rows += bench_shape(name, ms, dtype, args, num_sms, entries)
    print(f"\n{torch.cuda.get_device_name()}, {args.dtype}, device copy {copy_bw / 1e12:.2f} "
          f"TB/s (read + write), {time.perf_counter() - start:.0f} s in all")  # fmt: skip
    print_table(rows, swept=not args.no_sweep)
    if entries:
        print("\nGEMV_TABLE entries (src/xinfer/kernels/gemv_launch.py):")
        print("\n".join(entries))


if __name__ == "__main__":
    main()
