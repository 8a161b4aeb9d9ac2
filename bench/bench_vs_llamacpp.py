"""xinfer's half of the llama.cpp comparison (`bench_vs_llamacpp.sh`): one GGUF file, batch-1
decode tok/s (128 tokens after a 32-token prompt) and the prefill rate of one long prompt,
fully resident and under a GPU memory budget (`--moe-offload auto`). Prints one JSON line
per placement. xinfer dequantizes GGUF blocks to bf16 at load (no raw-block kernels yet),
so its experts weigh bf16 bytes whatever the file's type: say so beside every row.

    python3 bench/bench_vs_llamacpp.py --gguf /tmp/q3-q4_k.gguf --budget-gb 12 --label q4_k"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from xinfer import LLM, SamplingParams  # noqa: E402


def _timed(llm: LLM, prompt: list[int], max_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate([prompt], params)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(llm: LLM, prompt_len: int, decode_tokens: int) -> dict:
    vocab = llm.engine.model_config.vocab_size
    gen = torch.Generator().manual_seed(0)
    short = torch.randint(100, vocab - 100, (32,), generator=gen).tolist()
    long = torch.randint(100, vocab - 100, (prompt_len,), generator=gen).tolist()
    _timed(llm, short, 8)  # warm-up: graphs, Triton compiles
    first = min(_timed(llm, short, 1) for _ in range(2))
    full = min(_timed(llm, short, decode_tokens + 1) for _ in range(2))
    prefill = min(_timed(llm, long, 1) for _ in range(2))
    return {
        "decode_tok_s": round(decode_tokens / (full - first), 1),
        f"pp{prompt_len}_tok_s": round(prompt_len / prefill, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--label", required=True, help="row name, e.g. qwen3-30b-a3b q4_k")
    ap.add_argument("--budget-gb", type=float, default=None, help="also run under this budget")
    ap.add_argument("--skip-resident", action="store_true", help="bf16 of the file > the GPU")
    ap.add_argument("--prompt-len", type=int, default=8192)
    ap.add_argument("--decode-tokens", type=int, default=128)
    args = ap.parse_args()
    runs = [] if args.skip_resident else [("resident", {})]
    if args.budget_gb:
        runs.append(
            (
                f"{args.budget_gb:g} GB auto",
                {"moe_offload": "auto", "gpu_memory_limit_gb": args.budget_gb},
            )
        )
    for placement, options in runs:
        start = time.perf_counter()
        llm = LLM(args.gguf, max_model_len=args.prompt_len + 256, **options)
        row = {"engine": "xinfer", "model": args.label, "placement": placement}
        row["load_s"] = round(time.perf_counter() - start, 1)
        row.update(measure(llm, args.prompt_len, args.decode_tokens))
        stats = llm.engine.offload_manager.stats() if llm.engine.offload_manager else None
        if stats is not None:
            row["offload"] = str(stats)[:300]
        print(json.dumps(row), flush=True)
        del llm
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
