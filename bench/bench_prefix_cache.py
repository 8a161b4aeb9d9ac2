"""What prefix caching saves on a chat's second turn: the time to first token of turn 2
(turn 1's prompt and answer plus a new question) with turn 1's KV blocks cached (warm) and
with the cache emptied (cold), per MoE offload rate. Under offload a long prefill streams
whole expert layers per chunk, so the cached prefix saves copies as well as compute.

    python bench/bench_prefix_cache.py --model bench/configs/qwen3_30b_a3b --rates 0,0.2
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

from xinfer import LLM, SamplingParams


def ttft(engine, prompt: list[int]) -> float:
    """Seconds from adding `prompt` to its first token (the request is then finished)."""
    t = time.perf_counter()
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def run_rate(args, rate: str, turn1: list[int], question: list[int]) -> dict:
    kw = dict(device=args.device, dtype=args.dtype, load_format="dummy")
    kw["max_model_len"] = args.max_model_len
    if rate != "0":
        kw["moe_offload"] = rate
    llm = LLM(args.model, **kw)
    engine = llm.engine
    answer = llm.generate([turn1], SamplingParams(temperature=0.0, max_tokens=args.answer))
    turn2 = turn1 + answer[0].token_ids + question
    ttft(engine, turn2)  # warm-up: kernels compiled for these shapes
    cold, warm, moved_cold, moved_warm = [], [], [], []
    for _ in range(args.repeats):
        engine.allocator.reset_prefix_cache()  # nothing cached: the whole prompt computes
        before = llm.offload_stats()
        cold.append(ttft(engine, turn2))
        after = llm.offload_stats()
        moved_cold.append(0 if after is None else after["bytes_moved"] - before["bytes_moved"])
        engine.allocator.reset_prefix_cache()
        ttft(engine, turn1 + answer[0].token_ids)  # what turn 1 leaves cached
        before = llm.offload_stats()
        warm.append(ttft(engine, turn2))
        after = llm.offload_stats()
        moved_warm.append(0 if after is None else after["bytes_moved"] - before["bytes_moved"])
    stats = engine.prefix_cache_stats()
    row = {
        "rate": rate,
        "prompt_tokens": len(turn2),
        "ttft_cold_s": min(cold),
        "ttft_warm_s": min(warm),
        "speedup": min(cold) / min(warm),
        "gb_moved_cold": min(moved_cold) / 1e9,
        "gb_moved_warm": min(moved_warm) / 1e9,
        "hit_rate": stats.hit_rate,
    }
    if engine.offload_manager is not None:
        engine.offload_manager.close()
    del llm, engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bench/configs/qwen3_30b_a3b")
    ap.add_argument("--rates", default="0,0.2")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--turn1-tokens", type=int, default=4000)
    ap.add_argument("--answer", type=int, default=64, help="tokens of turn 1's answer")
    ap.add_argument("--question-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="bench/results/prefix_cache")
    args = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    vocab = min(1000, json.loads((Path(args.model) / "config.json").read_text())["vocab_size"])
    turn1 = torch.randint(0, vocab, (args.turn1_tokens,), generator=gen).tolist()
    question = torch.randint(0, vocab, (args.question_tokens,), generator=gen).tolist()
    rows = []
    for rate in args.rates.split(","):
        rows.append(run_rate(args, rate, turn1, question))
        print(rows[-1], flush=True)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0) if args.device != "cpu" else "cpu",
        "model": args.model,
        "command": " ".join(sys.argv),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        f"Second-turn time to first token, {meta['date']}, {meta['gpu']}, {args.model}",
        "",
        "| GPU experts | prompt tokens | cold TTFT s | cached TTFT s | speedup | GB moved cold | "
        "GB moved cached |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        label = "all (resident)" if r["rate"] == "0" else r["rate"]
        lines.append(
            f"| {label} | {r['prompt_tokens']} | {r['ttft_cold_s']:.3f} | "
            f"{r['ttft_warm_s']:.3f} | {r['speedup']:.1f}x | {r['gb_moved_cold']:.1f} | "
            f"{r['gb_moved_warm']:.1f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


if __name__ == "__main__":
    main()
