"""Time to first token of long prompts through the engine, resident and under MoE offload:
prompts longer than the step budget run as prompt passes (layer by layer across their
chunks; offloaded layers streamed once per prompt, double-buffered). Each engine runs every
prompt length twice, with two different prompts (the first right after start-up: the cold
case a server's first user sees; a repeated prompt would be served by the prefix cache),
greedy, one new token; the first tokens are compared across rates.

    python3 bench/bench_prompt_pass.py --model bench/configs/qwen3_30b_a3b \
        --rates 0,0.1 --lengths 2048,8192,32768 --out /tmp/prompt_pass

Per row: TTFT, prefill tok/s, GB streamed (prompt-pass layer streams + fills) and the
pass's floor `max(resident TTFT, streamed bytes / copy-engine GB/s)`; rate 0 is resident."""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from offload_bench.bandwidth import copy_engine_gbps  # noqa: E402

from xinfer import LLM, SamplingParams  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def ttft(llm: LLM, prompt: list[int]) -> tuple[float, int]:
    """Seconds from add_request to the first token (engine steps, synchronised), and it."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    _sync()
    t = time.perf_counter()
    engine.add_request(prompt, params)
    token = None
    while engine.has_unfinished():
        for out in engine.step():
            token = out.new_token_ids[0]
    _sync()
    return time.perf_counter() - t, token


def run_rate(args, rate: str, prompts: dict[tuple[int, str], list[int]]) -> list[dict]:
    longest = max(len(p) for p in prompts.values())
    kw = dict(
        device=args.device,
        dtype="bfloat16" if args.device.startswith("cuda") else "float32",
        load_format="dummy",
        dummy_weights_seed=0,
        max_model_len=longest + 64,
        max_num_batched_tokens=args.budget,
        max_num_seqs=4,
    )
    if rate != "0":
        kw["moe_offload"] = rate
        if args.device.startswith("cuda"):
            kw["gpu_memory_limit_gb"] = args.gpu_memory_limit_gb
    t0 = time.perf_counter()
    llm = LLM(args.model, **kw)
    print(f"rate {rate}: loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for (n, attempt), prompt in prompts.items():
        before = llm.offload_stats()
        seconds, token = ttft(llm, prompt)
        after = llm.offload_stats()
        row = {"rate": rate, "tokens": n, "attempt": attempt, "ttft_s": seconds}
        row.update(tok_s=n / seconds, first_token=token)
        if after is not None:
            row["gb_moved"] = (after["bytes_moved"] - before["bytes_moved"]) / 1e9
            row["layer_streams"] = after["staging_copies"] - before["staging_copies"]
            row["slots"] = after["slots_per_layer"][0]
        rows.append(row)
        print(json.dumps(row), flush=True)
    if llm.engine.offload_manager is not None:
        llm.engine.offload_manager.close()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bench/configs/qwen3_30b_a3b")
    ap.add_argument("--rates", default="0,0.1")
    ap.add_argument("--lengths", default="2048,8192,32768")
    ap.add_argument("--budget", type=int, default=2048, help="--max-num-batched-tokens")
    ap.add_argument("--gpu-memory-limit-gb", type=float, default=24.0)
    ap.add_argument("--out", default=None, help="writes OUT.json and OUT.md")
    ap.add_argument("--device", default="cuda:0", help="cpu: a smoke run (no bandwidth)")
    args = ap.parse_args()
    rng = random.Random(0)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    # Two different prompts per length (the prefix cache would serve a repeated one).
    prompts = {
        (int(n), attempt): [rng.randrange(vocab) for _ in range(int(n))]
        for n in args.lengths.split(",")
        for attempt in ("first", "second")
    }
    on_gpu = args.device.startswith("cuda")
    gbps = copy_engine_gbps(torch.device(args.device), 9_437_184, 8, 20) if on_gpu else 55.0
    rows = [r for rate in args.rates.split(",") for r in run_rate(args, rate, prompts)]
    resident = {
        r["tokens"]: r["ttft_s"] for r in rows if r["rate"] == "0" and r["attempt"] == "second"
    }
    lines = [
        f"copy engine {gbps:.1f} GB/s; floor = max(resident TTFT, GB moved / that)",
        "| rate | prompt | attempt | TTFT s | tok/s | GB moved | layer streams | floor s | TTFT / floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        floor = max(resident.get(r["tokens"], 0.0), r.get("gb_moved", 0.0) / gbps)
        ratio = r["ttft_s"] / floor if floor else float("nan")
        lines.append(
            f"| {r['rate']} | {r['tokens']} | {r['attempt']} | {r['ttft_s']:.3f} | "
            f"{r['tok_s']:.0f} | {r.get('gb_moved', 0):.2f} | {r.get('layer_streams', '-')} | "
            f"{floor:.3f} | {ratio:.2f} |"
        )
    firsts = {(r["tokens"], r["attempt"]): set() for r in rows}
    for r in rows:
        firsts[(r["tokens"], r["attempt"])].add(r["first_token"])
    same = all(len(v) == 1 for v in firsts.values())
    lines.append(f"\nfirst tokens identical across rates: {same}")
    print("\n".join(lines))
    if args.out:
        Path(args.out + ".json").write_text(json.dumps({"gbps": gbps, "rows": rows}, indent=1))
        Path(args.out + ".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
