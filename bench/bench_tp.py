"""Tensor parallel decode: TP=1 against TP=2 (or more) on one host, resident and with MoE
offload per rank, each beside its limit.

    python3 bench/bench_tp.py --model bench/configs/qwen3_30b_a3b --tp 1,2 \
        --rates 0,0.1,0.2,auto --batches 1,8,32 --gpu-memory-limit-gb 24 --out bench/results/tp

Every (TP size, rate) runs in a child process of its own (one tensor-parallel engine per
process; a clean GPU for the next). Rate 0 is resident (no limit on GPU memory); the others
offload with `--gpu-memory-limit-gb` per rank. Per batch size: median decode step, tok/s,
and for offload the per-rank GB moved per step. Limits: resident, the HBM floor of the
rank's share of the step's bytes; offload, the resident step of the same TP size plus the
slowest rank's share of the missed bytes over its own host→GPU link. Greedy tokens and the
first step's top-20 logprobs are compared with TP=1 resident (bf16: within a tolerance).
Dummy weights; `--engine-option k=v` passes an engine option (e.g. a routing model)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPT_LEN, GREEDY_TOKENS = 64, 16


def _prompt(seed: int, vocab: int) -> list[int]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(1000, vocab), (PROMPT_LEN,), generator=g).tolist()


def _counters(stats: dict | None) -> tuple[list[int], int, int]:
    """(bytes moved per rank, hits, misses) of the offload stats so far."""
    if stats is None:
        return [], 0, 0
    ranks = stats.get("ranks", [stats])
    return [r["bytes_moved"] for r in ranks], stats["hits"], stats["misses"]


def time_batch(llm, batch: int, steps: int, warm: int) -> dict:
    """Median decode step of `batch` sequences (seeded sampling: dummy weights under greedy
    decoding repeat one token, so routing would never change) and the bytes each rank
    moved per step meanwhile."""
    from xinfer import SamplingParams

    engine = llm.engine
    for i in range(batch):
        params = SamplingParams(
            temperature=1.0, seed=1000 + i, max_tokens=steps + warm, ignore_eos=True
        )
        engine.add_request(_prompt(i, engine.model_config.vocab_size), params)
    for _ in range(warm):  # prefill, then a few decodes to settle the caches
        engine.step()
    before, times = _counters(llm.offload_stats()), []
    while engine.has_unfinished():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    stats = llm.offload_stats()
    step = statistics.median(times[:-1] or times)  # the last step finishes every request
    row = {"batch": batch, "step_ms": step * 1e3, "tok_s": batch / step}
    if stats is not None:
        (b0, h0, m0), (b1, h1, m1) = before, _counters(stats)
        moved = [(b - a) / len(times) / 1e9 for a, b in zip(b0, b1)]
        row.update(gb_per_step_rank=moved, hit_rate=(h1 - h0) / max(1, h1 - h0 + m1 - m0))
    return row


def child(args) -> dict:
    """One (TP size, rate): build the engine, check its greedy tokens, time every batch."""
    import torch

    from xinfer import LLM, SamplingParams

    tp = int(args.tp)
    devices = ["cpu" if args.cpu else str(i) for i in range(tp)]
    kw = dict(
        device=",".join(devices),
        dtype="float32" if args.cpu else "bfloat16",
        load_format="dummy",
        max_model_len=args.max_model_len,
        num_kv_blocks=2048,
        max_num_seqs=max(int(b) for b in args.batches.split(",")),
        dummy_weights_seed=0,
    )
    if args.rate != "0":
        kw.update(moe_offload=args.rate, gpu_memory_limit_gb=args.gpu_memory_limit_gb)
    for option in args.engine_option:
        key, _, value = option.partition("=")
        kw[key] = value
    t0 = time.perf_counter()
    llm = LLM(args.model, **kw)
    out: dict = {"tp": tp, "rate": args.rate, "load_s": time.perf_counter() - t0}
    greedy = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, logprobs=20)
    res = llm.generate([_prompt(99, llm.engine.model_config.vocab_size)], greedy)[0]
    out["greedy"] = res.token_ids
    first = res.logprobs[0]
    out["first_logprobs"] = dict(zip(map(str, first.top_ids), first.top_logprobs))
    graph_runner = llm.engine.runner.graph_runner
    out["graphs"] = sorted(graph_runner.graphs) if graph_runner else []
    stats = llm.offload_stats()
    if stats is not None:
        out["slots_per_rank"] = [r["slots_per_layer"][0] for r in stats.get("ranks", [stats])]
    out["rows"] = []
    for b in args.batches.split(","):
        out["rows"].append(time_batch(llm, int(b), args.steps, args.warmup_steps))
        print(json.dumps(out["rows"][-1]), file=sys.stderr, flush=True)
    out["look_ahead"] = dict(llm.engine.runner.look_ahead_counts)
    out["gpu"] = "cpu" if args.cpu else torch.cuda.get_device_name(0)
    llm.close()
    return out


def h2d_gbps(device: int) -> float:
    """Pinned host → GPU copy rate of one GPU (its own link), measured in a subprocess."""
    script = Path(__file__).resolve().parent / "offload_bench" / "bandwidth.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--device", str(device)], capture_output=True, text=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])["copy_engine_block_gbps"]


def compare(ref: dict, run: dict) -> str:
    """'equal', or the relative L2 error of the first step's shared top logprobs."""
    if run["greedy"] == ref["greedy"]:
        return "equal"
    common = sorted(set(ref["first_logprobs"]) & set(run["first_logprobs"]))
    a = [ref["first_logprobs"][i] for i in common]
    b = [run["first_logprobs"][i] for i in common]
    err = sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5 / max(1e-9, sum(x * x for x in a) ** 0.5)
    return f"differs (first-step logprobs rel. err {err:.1e} over {len(common)} tokens)"


def report(args, runs: list[dict], bw: list[float], hbm: float) -> str:
    """The markdown table; `bw` host→GPU GB/s per GPU, `hbm` device copy bytes/s."""
    from bench_decode import step_bytes

    from xinfer.config import ModelConfig

    cfg = ModelConfig.from_dir(args.model)
    ref = next((r for r in runs if r["tp"] == 1 and r["rate"] == "0"), runs[0])
    resident = {(r["tp"], row["batch"]): row["step_ms"] for r in runs if r["rate"] == "0"
                for row in r["rows"]}  # fmt: skip
    lines = [
        f"Tensor-parallel decode, {time.strftime('%Y-%m-%d')}, {runs[0].get('gpu', '?')}, "
        f"H2D per GPU {', '.join(f'{b:.1f}' for b in bw) or '—'} GB/s, "
        f"HBM {hbm / 1e12:.2f} TB/s",
        "",
        "| TP | GPU experts | slots/layer per rank | batch | tok/s | ms/step | limit ms | "
        "step / limit | hit rate | GB/step per rank | greedy vs TP=1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        slots = ",".join(map(str, run.get("slots_per_rank", []))) or "all"
        for row in run["rows"]:
            tp, b = run["tp"], row["batch"]
            if not hbm:  # --cpu: no limits
                limit = None
            elif run["rate"] == "0":
                limit = step_bytes(cfg, b, PROMPT_LEN + args.steps) / tp / hbm * 1e3
            elif (tp, b) in resident:
                # each rank copies its own share over its own link, all at once
                share_s = max(g / bw[r] for r, g in enumerate(row["gb_per_step_rank"]))
                limit = resident[(tp, b)] + share_s * 1e3
            else:
                limit = None
            ratio = f"{row['step_ms'] / limit:.2f}" if limit else "—"
            gb = ",".join(f"{g:.3f}" for g in row.get("gb_per_step_rank", [])) or "0"
            hit = f"{100 * row['hit_rate']:.1f}%" if "hit_rate" in row else "—"
            lines.append(
                f"| {tp} | {'all' if run['rate'] == '0' else run['rate']} | {slots} | {b} | "
                f"{row['tok_s']:.1f} | {row['step_ms']:.2f} | "
                f"{'—' if limit is None else f'{limit:.2f}'} | {ratio} | {hit} | {gb} | "
                f"{'ref' if run is ref else compare(ref, run)} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bench/configs/qwen3_30b_a3b")
    ap.add_argument("--tp", default="1,2", help="TP sizes (GPUs 0..n-1)")
    ap.add_argument("--rates", default="0,0.1,0.2,auto", help="0 = resident")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--gpu-memory-limit-gb", type=float, default=24.0, help="per rank")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--warmup-steps", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--cpu", action="store_true", help="CPU ranks (a smoke test of this script)")
    ap.add_argument("--out", default="bench/results/tp")
    ap.add_argument("--append", action="store_true", help="add to the runs already in --out")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rate", default="0", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return
    sizes = [int(t) for t in args.tp.split(",")]
    bw, hbm = [], 0.0
    if not args.cpu:
        import torch
        from cuda_timing import device_copy_bandwidth

        bw = [h2d_gbps(d) for d in range(max(sizes))]
        hbm = device_copy_bandwidth(torch.device("cuda:0"))
        torch.cuda.empty_cache()
    out, runs = Path(args.out), []
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.append and out.with_suffix(".json").exists():  # a run split over several calls
        runs = json.loads(out.with_suffix(".json").read_text())["runs"]
    for tp in sizes:
        for rate in args.rates.split(","):
            cmd = [sys.executable, __file__, "--child", "--tp", str(tp), "--rate", rate]
            cmd += ["--model", args.model, "--batches", args.batches]
            cmd += ["--gpu-memory-limit-gb", str(args.gpu_memory_limit_gb)]
            cmd += ["--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps)]
            cmd += ["--max-model-len", str(args.max_model_len)] + (["--cpu"] if args.cpu else [])
            for option in args.engine_option:
                cmd += ["--engine-option", option]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                print(f"TP={tp} rate={rate} failed (exit {proc.returncode})", flush=True)
                continue
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            meta = {"command": " ".join(sys.argv), "h2d_gbps": bw, "hbm_bps": hbm}
            out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
            table = report(args, runs, bw, hbm)
            out.with_suffix(".md").write_text(table)
            print(table, flush=True)


if __name__ == "__main__":
    main()
