"""One table from `bench_vs_llamacpp.sh`'s JSON lines: xinfer and llama.cpp measured in this
run, beside the llama.cpp figures of issue 16 (H200, 2026-12-03, the peer kit, `-fa 1 -t 16`)
and the ratio to them where the issue sets a target.

    python3 bench/bench_vs_llamacpp_table.py bench/results/vs_llamacpp.jsonl"""

from __future__ import annotations

import json
import sys

# (model, placement) → (llama.cpp decode tok/s, pp8192 tok/s) from the issue
ISSUE = {
    ("qwen3-30b-a3b q4_k", "resident"): (310.7, 9983.0),
    ("qwen3-30b-a3b q4_k", "12 GB"): (94.3, 2756.0),
    ("qwen1.5-moe-a2.7b bf16", "resident"): (296.4, None),
    ("qwen1.5-moe-a2.7b bf16", "12 GB"): (53.4, 365.0),
}
# (model, placement) → (decode, prefill) targets as multiples of llama.cpp's
TARGETS = {
    ("qwen3-30b-a3b q4_k", "resident"): (1.5, None),
    ("qwen3-30b-a3b q4_k", "12 GB"): (3.0, 3.0),
    ("qwen1.5-moe-a2.7b bf16", "12 GB"): (2.0, 3.0),
}


def _key(row: dict) -> tuple[str, str]:
    """(model as the issue names it, placement as 'resident' or 'N GB')."""
    model = row["model"].split(" isq ")[0]
    place = row["placement"]
    if place.startswith("-ncmoe"):
        place = {"q4_k": "12 GB", "q8_0": "24 GB", "bf16": "12 GB"}[model.split()[-1]]
    return model, "resident" if place == "resident" else place.replace(" auto", "")


def _fmt(x) -> str:
    return "" if x in (None, "") else f"{x:,.1f}"


def main(path: str) -> None:
    # result rows are JSON objects; other lines the runs printed (notes, progress) are not
    rows = [json.loads(line) for line in open(path) if line.lstrip().startswith("{")]
    merged: dict[tuple, dict] = {}
    for r in rows:
        key = (r["model"], r["engine"], r["placement"])
        merged.setdefault(key, {}).update(r)
    head = f"{'model':34} {'engine':10} {'placement':12} {'decode':>8} {'pp8192':>9}"
    print(head + f" {'llama.cpp (issue)':>19} {'decode x':>9} {'pp x':>6}  experts / offload")
    for (model, engine, place), r in sorted(merged.items()):
        pp = next((v for k, v in r.items() if k.startswith("pp") and k.endswith("tok_s")), None)
        dec = r.get("decode_tok_s")
        ref = ISSUE.get(_key(r), (None, None))
        ratios = ["", ""]
        if engine == "xinfer" and not r["model"].count(" isq "):
            goal = TARGETS.get(_key(r), (None, None))
            for i, (ours, theirs, target) in enumerate(zip((dec, pp), ref, goal)):
                if ours and theirs:
                    ok = "" if target is None else (" ok" if ours / theirs >= target else " <")
                    ratios[i] = f"{ours / theirs:.2f}{ok}"
        extra = r.get("experts", "")
        if "hit_rate" in r:
            extra += f" slots {r['slots_per_layer']}/{r['num_experts']} hit {r['hit_rate']:.2f}"
        issue = f"{_fmt(ref[0])} / {_fmt(ref[1])}" if engine == "xinfer" and ref[0] else ""
        print(
            f"{model:34} {engine:10} {place:12} {_fmt(dec):>8} {_fmt(pp):>9} {issue:>19} "
            f"{ratios[0]:>9} {ratios[1]:>6}  {extra}"
        )
    print("targets (issue 16): resident Q4_K decode >= 1.5x; under the budget decode >= 3x "
          "(Q4_K) / 2x (bf16 Qwen1.5) and pp8192 >= 3x llama.cpp's (ok / <).")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/vs_llamacpp.jsonl")
