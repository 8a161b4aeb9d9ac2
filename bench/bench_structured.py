"""What grammar rows cost the batch: decode tok/s of B plain greedy rows alone, with one
grammar row added, and with every row under a grammar (a regex that never closes, so all rows
run the full length). Default: the demo model on GPU 0.
`python bench/bench_structured.py --model demo --batch 8 --tokens 256`"""

from __future__ import annotations

import argparse
import json
import time

from xinfer.args import parse_device
from xinfer.config import EngineConfig
from xinfer.engine.engine import Engine
from xinfer.llm import demo_model_path
from xinfer.sampling import SamplingParams
from xinfer.structured import GrammarSpec

TEXT = GrammarSpec("regex", "[a-z ,.]{0,100000}")


def run(engine: Engine, batch: int, num_grammar: int, tokens: int) -> float:
    for i in range(batch):
        grammar = TEXT if i < num_grammar else None
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True, grammar=grammar)
        engine.add_request([5 + i, 6, 7], params)
    while engine.has_unfinished() and not engine.scheduler.running:
        engine.step()
    engine.step()  # the prefill step; time the decode steps only
    start, count = time.perf_counter(), 0
    while engine.has_unfinished():
        count += len(engine.step())
    return count / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--device", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args()
    model = demo_model_path() if args.model == "demo" else args.model
    engine = Engine(EngineConfig(model=model, device=parse_device(args.device)))
    engine.grammar_compiler.warm_up()
    run(engine, args.batch, 0, 16)  # warm-up
    results = {}
    for num_grammar in (0, 1, args.batch):
        results[f"{num_grammar}_of_{args.batch}_grammar_rows_tok_s"] = round(
            run(engine, args.batch, num_grammar, args.tokens), 1
        )
    results["look_ahead"] = engine.runner.look_ahead_counts
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
