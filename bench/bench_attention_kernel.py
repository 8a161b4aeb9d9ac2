"""Benchmark of the Triton paged-attention kernels on the Qwen3-30B-A3B attention shape (32 query
heads, 4 KV heads, head_dim 128, bf16, block_size 16, shuffled block tables). CUDA only.

Default: decode at batch 1/8/32 and context 2k/8k, timed as CUDA-graph replay over several
layers' caches (so L2 does not serve the next call), and a 2k-token prefill (fresh, and chunked
after 6k cached tokens). Reports GB/s of KV read against the measured device copy bandwidth,
TFLOP/s for prefill next to torch SDPA on contiguous tensors. Checks correctness against
`reference.py` first.

--sweep: only the decode launch-config sweep. For batch 1/8/32 at contexts 128, 1024, 4096
(bound max_seq_len 4096) and 8000 (bound 8192), every candidate (SPLIT_LEN x BLOCK_N x
num_warps x num_stages) is checked against `reference.py`, then timed per layer call as CUDA-graph
replays of back-to-back calls on distinct caches (>= 256 MiB of KV a replay, so L2 does not
serve the next one). Prints a table in us, the best config per case next to the current
default (`attn_launch.DECODE_CONFIGS`), and per bound the config closest to the best over all
batches (geometric mean of time / best), as a row to paste into DECODE_CONFIGS.

    python bench/bench_attention_kernel.py                  # default tables
    python bench/bench_attention_kernel.py --sweep          # decode configs (~1 min)
    python bench/bench_attention_kernel.py --sweep-prefill  # prefill tiles
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from cuda_timing import calls_graph_seconds as graph_timed  # noqa: E402
from cuda_timing import cuda_seconds as timed  # noqa: E402
from cuda_timing import device_copy_bandwidth

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from xinfer.kernels import attn_flash, reference  # noqa: E402
from xinfer.kernels import attn_launch as al  # noqa: E402

DEV = "cuda"
DTYPE = torch.bfloat16
# decode sweep: (context, bound max_seq_len) per batch, and the candidate launch configs
SWEEP_BATCHES = (1, 8, 32)
SWEEP_CONTEXTS = ((128, 4096), (1024, 4096), (4096, 4096), (8000, 8192))
SWEEP_SPLITS = (32, 64, 128, 256, 512)
SWEEP_TILES = ((32, 4), (64, 4), (64, 8), (128, 8))  # (BLOCK_N, num_warps): no spills on sm_90
SWEEP_STAGES = (1, 2, 3)
SWEEP_KV_BYTES = 256 << 20  # KV read per graph replay (5x the H200's L2)
SWEEP_MAX_CALLS = 512  # calls per graph


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--contexts", default="2048,8192")
    p.add_argument("--prefill", type=int, default=2048, help="new tokens in the prefill rows")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--sweep", action="store_true", help="only sweep the decode launch configs")
    p.add_argument("--sweep-iters", type=int, default=10, help="graph replays per sweep timing")
    p.add_argument("--sweep-prefill", action="store_true", help="only sweep the prefill tiles")
    return p.parse_args()


def paged_case(a, seq_lens: list[int], query_lens: list[int], layers: int = 1):
    """q, [(k_cache, v_cache)] * layers, block tables (one shuffled table for all layers)."""
    bs = a.block_size
    blocks_per_seq = max(math.ceil(s / bs) for s in seq_lens)
    num_blocks = len(seq_lens) * blocks_per_seq
    shape = (num_blocks, bs, a.kv_heads, a.head_dim)
    caches = [
        (torch.randn(shape, device=DEV, dtype=DTYPE), torch.randn(shape, device=DEV, dtype=DTYPE))
        for _ in range(layers)
    ]
    tables = torch.randperm(num_blocks, device=DEV).view(len(seq_lens), -1).to(torch.int32)
    q = torch.randn(sum(query_lens), a.heads, a.head_dim, device=DEV, dtype=DTYPE)
    qsl = torch.tensor([0, *query_lens], device=DEV).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, device=DEV, dtype=torch.int32)
    return q, caches, tables, lens, qsl


def check_correctness(a) -> None:
    scale = a.head_dim**-0.5
    for seq_lens, query_lens in (
        ([1, 17, 1000, 2100, 0], [1] * 5),
        ([40, 1030, 2048], [1, 5, 2048]),
    ):
        q, [(k, v)], tables, lens, qsl = paged_case(a, [max(s, 1) for s in seq_lens], query_lens)
        lens.copy_(torch.tensor(seq_lens, device=DEV))
        ref = reference.paged_attention(q, k, v, tables, lens, qsl, scale)
        got = al.paged_attention(q, k, v, tables, lens, qsl, scale)
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
    print("correctness: decode and prefill match reference.py (atol = rtol = 2e-2)")


def kv_bytes(a, batch: int, ctx: int) -> int:
    return 2 * batch * ctx * a.kv_heads * a.head_dim * DTYPE.itemsize  # K and V


def bench_decode(a, batch: int, ctx: int, copy_bw: float) -> dict:
    nbytes = kv_bytes(a, batch, ctx)
    layers = max(2, min(48, math.ceil((2 << 30) / nbytes)))  # >= 2 GiB of KV in the graph
    q, caches, tables, lens, qsl = paged_case(a, [ctx] * batch, [1] * batch, layers)
    scale = a.head_dim**-0.5
    calls = [
        lambda k=k, v=v: al.paged_attention(q, k, v, tables, lens, qsl, scale, 1, ctx)
        for k, v in caches
    ]
    sec = graph_timed(calls, a.iters)
    cfg = al.decode_config(q, a.head_dim, ctx)
    del caches, calls
    return dict(
        batch=batch, ctx=ctx, splits=al.decode_num_splits(ctx, cfg["SPLIT_LEN"]), us=sec * 1e6,
        mb=nbytes / 1e6, gbs=nbytes / sec / 1e9, pct=100 * nbytes / sec / copy_bw,
    )  # fmt: skip


def bench_prefill(a, new: int, ctx: int, config=None, sdpa: bool = True) -> dict:
    q, [(k, v)], tables, lens, qsl = paged_case(a, [ctx], [new])
    scale = a.head_dim**-0.5
    sec = timed(
        lambda: al.paged_attention(q, k, v, tables, lens, qsl, scale, config=config), a.iters
    )
    visible = sum(ctx - new + i + 1 for i in range(new))  # causal (query, key) pairs
    flops = 4 * a.heads * a.head_dim * visible
    sdpa_us = float("nan")
    if sdpa and new == ctx:  # torch SDPA (flash) on contiguous tensors, same math
        qs = q.view(1, new, a.heads, a.head_dim).transpose(1, 2)
        ks = torch.randn(1, a.kv_heads, new, a.head_dim, device=DEV, dtype=DTYPE)
        fn = lambda: F.scaled_dot_product_attention(qs, ks, ks, is_causal=True, enable_gqa=True)
        sdpa_us = timed(fn, a.iters) * 1e6
    return dict(
        new=new, ctx=ctx, us=sec * 1e6, tflops=flops / sec / 1e12, sdpa_us=sdpa_us, cfg=config
    )


PREFILL_TILES = (  # (BLOCK_M, BLOCK_N, num_warps, num_stages); the first is the default
    (64, 64, 4, 2), (128, 32, 8, 2), (128, 32, 8, 3), (128, 64, 8, 2), (128, 64, 8, 3),
    (128, 128, 8, 2), (128, 64, 4, 2), (128, 32, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2),
    (64, 32, 4, 2),
)  # fmt: skip


def sweep_prefill(a) -> None:
    """Every PREFILL_TILES config checked against reference.py, then timed on a fresh prompt
    of `--prefill` tokens and on the same tokens after 15 × as many cached ones (a late
    chunk of a long prompt: where a 32k TTFT spends its attention time)."""
    scale = a.head_dim**-0.5
    q, [(k, v)], tables, lens, qsl = paged_case(a, [40, 1030, 2048], [1, 5, 2048])
    ref = reference.paged_attention(q, k, v, tables, lens, qsl, scale)
    cases = ((a.prefill, a.prefill), (a.prefill, 16 * a.prefill))
    print("prefill tile sweep, one sequence, µs (TFLOP/s); SDPA flash: fresh causal prompt of")
    print("the context's length on contiguous tensors (its TFLOP/s is the ceiling to compare)")
    for _, ctx in cases:
        print(f"  SDPA fresh {ctx}: {sdpa_tflops(a, ctx):.0f} TFLOP/s")
    print(
        "| BLOCK_M, BLOCK_N, warps, stages | "
        + " | ".join(f"{n} new / {c}" for n, c in cases)
        + " |"
    )
    print("|---|" + "---|" * len(cases))
    best = {}
    for bm, bn, warps, stages in PREFILL_TILES:
        cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
        try:
            got = al.paged_attention(q, k, v, tables, lens, qsl, scale, config=cfg)
            torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
        except Exception as e:  # a config that does not compile or is wrong: say so, go on
            print(f"| {bm}, {bn}, {warps}, {stages} | failed: {type(e).__name__}: {e} |"[:200])
            continue
        cells = []
        for new, ctx in cases:
            r = bench_prefill(a, new, ctx, cfg, sdpa=False)
            cells.append(f"{r['us']:.0f} ({r['tflops']:.0f})")
            if r["us"] < best.get((new, ctx), (float("inf"),))[0]:
                best[(new, ctx)] = (r["us"], (bm, bn, warps, stages))
        print(f"| {bm}, {bn}, {warps}, {stages} | " + " | ".join(cells) + " |")
    for key, (us, tiles) in best.items():
        print(f"best {key[0]} new / {key[1]}: {tiles} {us:.0f} µs")
    for new, ctx in cases:
        print(sdpa_split_row(a, new, ctx))


def sdpa_split_row(a, new: int, ctx: int) -> str:
    """The engine's FA2 candidate for long prompts (`kernels/attn_flash.py`,
    `XINFER_PREFILL_ATTENTION=flash`): the paged K/V gathered, then torch's flash attention
    twice — the new tokens against the cached prefix (no mask) and against themselves
    (causal) — merged by their log-sum-exps. Checked against the reference, then timed
    whole (gather included)."""
    scale = a.head_dim**-0.5
    q, [(k, v)], tables, lens, qsl = paged_case(a, [ctx], [new])

    def run() -> torch.Tensor:
        return attn_flash.prefill_one_sequence(q, k, v, tables[0], ctx, scale)

    try:
        ref = reference.paged_attention(q, k, v, tables, lens, qsl, scale)
        torch.testing.assert_close(run(), ref, atol=2e-2, rtol=2e-2)
    except Exception as e:  # the op or its GQA may be missing from this torch build
        return f"SDPA split {new} new / {ctx}: failed: {type(e).__name__}: {e}"[:200]
    sec = timed(run, a.iters)
    visible = sum(ctx - new + i + 1 for i in range(new))
    return (
        f"SDPA split {new} new / {ctx}: {sec * 1e6:.0f} µs "
        f"({4 * a.heads * a.head_dim * visible / sec / 1e12:.0f} TFLOP/s, gather included)"
    )


def sdpa_tflops(a, ctx: int) -> float:
    qs = torch.randn(1, a.heads, ctx, a.head_dim, device=DEV, dtype=DTYPE)
    ks = torch.randn(1, a.kv_heads, ctx, a.head_dim, device=DEV, dtype=DTYPE)
    fn = lambda: F.scaled_dot_product_attention(qs, ks, ks, is_causal=True, enable_gqa=True)  # noqa: E731
    sec = timed(fn, a.iters)
    return 4 * a.heads * a.head_dim * ctx * (ctx + 1) / 2 / sec / 1e12


def sweep_configs() -> list[tuple[int, int, int, int]]:
    """(SPLIT_LEN, BLOCK_N, num_warps, num_stages) candidates: whole tiles per split, and
    pipelining only where a split has more than one tile."""
    return [
        (split, bn, warps, stages)
        for split, (bn, warps), stages in itertools.product(SWEEP_SPLITS, SWEEP_TILES, SWEEP_STAGES)
        if split % bn == 0 and (stages == 1 or split > bn)
    ]


def as_config(key: tuple[int, int, int, int]) -> dict[str, int]:
    return dict(zip(("SPLIT_LEN", "BLOCK_N", "num_warps", "num_stages"), key, strict=True))


def sweep_case(a, batch: int, ctx: int, bound: int, keys: list) -> dict:
    """{config key: us per layer call, or None where it failed or disagreed with reference}."""
    layers = max(4, min(SWEEP_MAX_CALLS, math.ceil(SWEEP_KV_BYTES / kv_bytes(a, batch, ctx))))
    q, caches, tables, lens, qsl = paged_case(a, [ctx] * batch, [1] * batch, layers)
    scale = a.head_dim**-0.5
    ref = reference.paged_attention(q, *caches[0], tables, lens, qsl, scale)
    times = {}
    for key in keys:

        def call(k, v, cfg=as_config(key)):
            return al.paged_attention(q, k, v, tables, lens, qsl, scale, 1, bound, config=cfg)

        try:
            torch.testing.assert_close(call(*caches[0]), ref, atol=2e-2, rtol=2e-2)
            calls = [lambda k=k, v=v: call(k, v) for k, v in caches]
            times[key] = graph_timed(calls, a.sweep_iters) * 1e6
        except Exception as e:  # noqa: BLE001 - a failing candidate is reported, not fatal
            print(f"  B={batch} ctx={ctx} {as_config(key)}: {type(e).__name__}: {e}"[:300])
            times[key] = None
    return times


def default_key(a, bound: int) -> tuple[int, int, int, int]:
    q = torch.empty(1, a.heads, a.head_dim, device=DEV, dtype=DTYPE)
    cfg = al.decode_config(q, a.head_dim, bound)
    split = -(-cfg["SPLIT_LEN"] // cfg["BLOCK_N"]) * cfg["BLOCK_N"]
    return split, cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]


def fmt_key(key) -> str:
    return "split {:>3} BN {:>3} w {} st {}".format(*key)


def print_table(results: dict, keys: list, best: dict, defaults: dict) -> None:
    print("\nus per layer call (decode + reduce); * best of the column, D the current default")
    print(f"{'config':<26}" + "".join(f"{f'B{b}/{c}':>10}" for b, c, _ in results))
    for key in keys:
        cells = []
        for case, times in results.items():
            t = times[key]
            mark = ("*" if key == best[case][1] else "") + ("D" if key == defaults[case[2]] else "")
            cells.append(f"{'fail' if t is None else f'{t:.1f}'}{mark:<2}".rjust(10))
        print(f"{fmt_key(key):<26}" + "".join(cells))


def print_best(results: dict, best: dict, defaults: dict) -> None:
    print("\nbest per case vs the current default:")
    for case, times in results.items():
        (t, key), d = best[case], times[defaults[case[2]]]
        d_txt = "fail" if d is None else f"{d:.1f} us ({d / t:.2f}x the best)"
        print(f"  B={case[0]:<2} ctx={case[1]:<5} bound={case[2]}: best {t:.1f} us "
              f"[{fmt_key(key)}]; default {d_txt} [{fmt_key(defaults[case[2]])}]")  # fmt: skip


def print_per_bound(results: dict, keys: list, best: dict) -> None:
    """Per bound, the configs whose times over all its cases are closest to each case's best
    (geometric mean of time / best; configs that failed anywhere are left out)."""
    for bound in sorted({case[2] for case in results}):
        group = [case for case in results if case[2] == bound]
        scores = []
        for key in keys:
            times = [results[case][key] for case in group]
            if None not in times:
                logs = [math.log(t / best[case][0]) for t, case in zip(times, group, strict=True)]
                scores.append((math.exp(sum(logs) / len(logs)), key))
        scores.sort()
        print(f"\nbound {bound}: geometric mean of time / best over {len(group)} cases")
        if not scores:
            print("  no config ran in every case")
            continue
        for score, key in scores[:3]:
            print(f"  {score:.3f}  {fmt_key(key)}")
        row = ", ".join(f"{k}={v}" for k, v in as_config(scores[0][1]).items())
        print(f"  DECODE_CONFIGS row: ({bound}, dict({row})),")


def print_sweep(a, results: dict, keys: list) -> None:
    """The table (us per layer call), the best config per case, the recommendation per bound."""
    for case in [c for c, times in results.items() if not any(times.values())]:
        print(f"B={case[0]} ctx={case[1]}: every config failed")
        del results[case]
    defaults = {bound: default_key(a, bound) for _, _, bound in results}
    best = {
        c: min((t, k) for k, t in times.items() if t is not None) for c, times in results.items()
    }
    print_table(results, keys, best, defaults)
    print_best(results, best, defaults)
    print_per_bound(results, keys, best)


def sweep(a) -> None:
    keys = sweep_configs()
    bounds = sorted({bound for _, bound in SWEEP_CONTEXTS})
    keys += [k for k in {default_key(a, b) for b in bounds} if k not in keys]
    print(f"decode sweep: {len(keys)} configs x {len(SWEEP_BATCHES) * len(SWEEP_CONTEXTS)} cases")
    results, start = {}, time.perf_counter()
    for batch, (ctx, bound) in itertools.product(SWEEP_BATCHES, SWEEP_CONTEXTS):
        results[(batch, ctx, bound)] = sweep_case(a, batch, ctx, bound, keys)
        torch.cuda.empty_cache()
        print(f"  done B={batch} ctx={ctx} ({time.perf_counter() - start:.0f} s)", flush=True)
    print_sweep(a, results, keys)


def main() -> None:
    a = parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_attention_kernel.py needs a CUDA GPU")
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    if a.sweep or a.sweep_prefill:
        if a.sweep:
            sweep(a)
        if a.sweep_prefill:
            sweep_prefill(a)
        return
    check_correctness(a)
    copy_bw = device_copy_bandwidth()
    batches = [int(b) for b in a.batches.split(",")]
    contexts = [int(c) for c in a.contexts.split(",")]
    decode = [bench_decode(a, b, c, copy_bw) for b in batches for c in contexts]
    prefill = [bench_prefill(a, a.prefill, a.prefill), bench_prefill(a, a.prefill, 4 * a.prefill)]
    print(f"\ncopy bandwidth (read + write): {copy_bw / 1e12:.2f} TB/s")
    print(f"decode: Hq={a.heads} Hk={a.kv_heads} D={a.head_dim} bf16, CUDA graph, per layer call")
    print("| batch | context | splits | KV MB | us | KV GB/s | % of copy BW |")
    print("|---|---|---|---|---|---|---|")
    for r in decode:
        print(f"| {r['batch']} | {r['ctx']} | {r['splits']} | {r['mb']:.1f} | {r['us']:.1f} "
              f"| {r['gbs']:.0f} | {r['pct']:.0f}% |")  # fmt: skip
    print("\nprefill: eager, one sequence; SDPA on contiguous tensors (fresh prefill only)")
    print("| new tokens | context | us | TFLOP/s | torch SDPA us |")
    print("|---|---|---|---|---|")
    for r in prefill:
        print(
            f"| {r['new']} | {r['ctx']} | {r['us']:.0f} | {r['tflops']:.0f} | {r['sdpa_us']:.0f} |"
        )


if __name__ == "__main__":
    main()
