"""Batch-1 decode with MoE offload at several GPU-expert fractions, each beside its limit
`t_resident + missed bytes / host→GPU bandwidth` (both measured in the same run).

    python3 bench/bench_offload_decode.py --model bench/configs/qwen3_30b_a3b \
        --rates 0.1,0.2,0.35,0.5,auto --gpu-memory-limit-gb 24 --out bench/results/offload

Rate "0" (always run first) is the fully resident engine that gives t_resident. Greedy
tokens of every rate are compared with it: placement must never change the output."""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cuda_timing import cuda_seconds  # noqa: E402
from offload_bench.bandwidth import copy_engine_gbps  # noqa: E402

from xinfer import LLM, SamplingParams  # noqa: E402


def trace_steps(engine, prompt: list[int], params: SamplingParams, path: Path) -> None:
    """Chrome trace (host ops and GPU kernels) of four decode steps after a warm-up, to see
    what the lookup and fill kernels cost per layer."""
    from torch.profiler import ProfilerActivity, profile

    engine.add_request(prompt, params)
    for _ in range(8):
        engine.step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))


def gpu_state() -> str:
    """SM clock, temperature and power as nvidia-smi reads them right after a measurement
    ('' without nvidia-smi): steps that differ between engines can be told from clocks."""
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=clocks.sm,temperature.gpu,power.draw",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def bare_replay_ms(engine) -> float | None:
    """GPU time of the batch-1 decode graph replayed back to back (CUDA events), after the
    timed steps: a step minus this is the host's share. With offload the replays go on
    updating the slot tables, which is harmless once the statistics are read."""
    graphs = engine.runner.graph_runner.graphs if engine.runner.graph_runner else {}
    if 1 not in graphs:
        return None
    return cuda_seconds(graphs[1].replay, 64) * 1e3


def run_rate(args, rate: str, prompt: list[int]) -> dict:
    kw = dict(
        device="cuda:0",
        dtype="bfloat16",
        load_format="dummy",
        max_model_len=4096,
        num_kv_blocks=1024,
        max_num_seqs=1,
        dummy_weights_seed=0,
    )
    if rate != "0":
        kw["moe_offload"] = rate
    if rate == "auto":  # fixed fractions size themselves; auto sizes from the (limited) GPU
        kw["gpu_memory_limit_gb"] = args.gpu_memory_limit_gb
    t0 = time.perf_counter()
    llm = LLM(args.model, **kw)
    load_s = time.perf_counter() - t0
    engine = llm.engine
    # Seeded sampling: random weights under greedy decoding repeat one token, so routing
    # would never change; sampled tokens route (near) uniformly, as ANCHORS.md assumes.
    warm = args.warmup_steps
    params = SamplingParams(
        temperature=1.0, seed=1234, max_tokens=args.steps + warm, ignore_eos=True
    )
    engine.add_request(prompt, params)
    for _ in range(warm):  # prefill, warm the caches, let the clocks settle after loading
        engine.step()
    before = llm.offload_stats()
    times, tokens = [], []
    while engine.has_unfinished():
        t = time.perf_counter()
        for d in engine.step():
            tokens.extend(d.new_token_ids)
        times.append(time.perf_counter() - t)
    after = llm.offload_stats()
    replay_ms = bare_replay_ms(engine)
    look_ahead = dict(engine.runner.look_ahead_counts)
    if args.trace_dir:
        trace_steps(engine, prompt, params, Path(args.trace_dir) / f"offload_{rate}.json")
    step = statistics.median(times)
    row = {
        "gpu_state": gpu_state(),
        "rate": rate,
        "load_s": load_s,
        "step_ms": step * 1e3,
        "tok_s": 1 / step,
        "replay_ms": replay_ms,
        "look_ahead": look_ahead,
        "tokens": tokens,
        "graphs": bool(engine.runner.graph_runner and engine.runner.graph_runner.graphs),
    }
    if after is not None:
        n = len(times)
        hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
        row.update(
            slots=after["slots_per_layer"],
            hit_rate=hits / max(1, hits + misses),
            gb_per_token=(after["bytes_moved"] - before["bytes_moved"]) / n / 1e9,
        )
        llm.engine.offload_manager.close()
    del llm, engine
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bench/configs/qwen3_30b_a3b")
    ap.add_argument("--rates", default="0.1,0.2,0.35,0.5,auto")
    ap.add_argument("--gpu-memory-limit-gb", type=float, default=24.0)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--warmup-steps", type=int, default=8)
    ap.add_argument(
        "--resident-again",
        action="store_true",
        help="time the resident engine once more at the end (the spread between engines)",
    )
    ap.add_argument("--out", default="bench/results/offload")
    ap.add_argument("--trace-dir", default=None, help="also write a Chrome trace per rate")
    args = ap.parse_args()
    device = torch.device("cuda:0")
    bw = copy_engine_gbps(device, 512 << 20, 1, 5) * 1e9  # pinned host → GPU, bytes/s
    print(f"host→GPU copy bandwidth {bw / 1e9:.1f} GB/s", flush=True)
    prompt = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    rows = []
    rates = ["0"] + [r for r in args.rates.split(",") if r != "0"]
    for rate in rates + (["0"] if args.resident_again else []):
        row = run_rate(args, rate, prompt)
        t_res = rows[0]["step_ms"] / 1e3 if rows else row["step_ms"] / 1e3
        if "gb_per_token" in row:
            limit = t_res + row["gb_per_token"] * 1e9 / bw
            row.update(
                limit_ms=limit * 1e3, limit_tok_s=1 / limit, ratio=row["step_ms"] / 1e3 / limit
            )
        row["identical"] = row["tokens"] == (rows[0]["tokens"] if rows else row["tokens"])
        rows.append(row)
        print({k: v for k, v in row.items() if k != "tokens"}, flush=True)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(device),
        "h2d_bw": bw,
        "model": args.model,
        "gpu_memory_limit_gb": args.gpu_memory_limit_gb,
        "command": " ".join(sys.argv),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        f"Offload decode, batch 1, {meta['date']}, {meta['gpu']}, H2D {bw / 1e9:.1f} GB/s",
        "",
        "| GPU experts | slots/layer | tok/s | ms/token | bare replay ms | hit rate | GB/token | limit tok/s | step / limit | identical |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def replay(r: dict) -> str:
        return "—" if r.get("replay_ms") is None else f"{r['replay_ms']:.2f}"

    for i, r in enumerate(rows):
        if "gb_per_token" not in r:
            label = "all (resident)" if i == 0 else "all (resident, again)"
            lines.append(
                f"| {label} | all | {r['tok_s']:.1f} | {r['step_ms']:.2f} | {replay(r)} | 100% | 0 | — | — | ref |"
            )
            continue
        lines.append(
            f"| {r['rate']} | {r['slots'][0]} | {r['tok_s']:.1f} | {r['step_ms']:.2f} | "
            f"{replay(r)} | "
            f"{100 * r['hit_rate']:.1f}% | {r['gb_per_token']:.3f} | {r['limit_tok_s']:.1f} | "
            f"{r['ratio']:.2f} | {'yes' if r['identical'] else 'NO'} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
