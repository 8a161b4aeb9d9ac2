"""One table from `bench_vs_llamacpp.sh`'s JSON lines: xinfer and llama.cpp measured in this
run, each xinfer row beside llama.cpp on the same machine where this run measured it (`here`),
else beside the figures of issue 16 (H200, 2026-12-03, the peer kit, `-fa 1 -t 16`: `issue`),
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
        place = {"q4_k": "12 GB", "q4_k_m": "12 GB", "q8_0": "24 GB", "bf16": "12 GB"}[
            model.split()[-1]
        ]
    # "12 GB auto" or "12 GB auto lfu" (a slot policy) → "12 GB"
    return model, "resident" if place == "resident" else " ".join(place.split()[:2])


def _pp(row: dict) -> float | None:
    """The row's prompt-processing tok/s (its `pp<N>_tok_s`), or None."""
    return next((v for k, v in row.items() if k.startswith("pp") and k.endswith("tok_s")), None)


def _fmt(x) -> str:
    return "" if x in (None, "") else f"{x:,.1f}"


def main(path: str) -> None:
    # result rows are JSON objects; other lines the runs printed (notes, progress) are not
    rows = [json.loads(line) for line in open(path) if line.lstrip().startswith("{")]
    merged: dict[tuple, dict] = {}
    for r in rows:
        key = (r["model"], r["engine"], r["placement"])
        merged.setdefault(key, {}).update(r)
    here = {  # llama.cpp measured in this run, by the key the issue's figures use
        _key(r): (r.get("decode_tok_s"), _pp(r))
        for (_, engine, _), r in merged.items()
        if engine == "llama.cpp"
    }
    head = f"{'model':34} {'engine':10} {'placement':12} {'decode':>8} {'pp8192':>9}"
    print(head + f" {'llama.cpp':>25} {'decode x':>9} {'pp x':>6}  experts / offload")
    for (model, engine, place), r in sorted(merged.items()):
        pp, dec = _pp(r), r.get("decode_tok_s")
        source = "here" if _key(r) in here else "issue"
        ref = here.get(_key(r)) or ISSUE.get(_key(r), (None, None))
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
        peer = (
            f"{_fmt(ref[0])} / {_fmt(ref[1])} ({source})" if engine == "xinfer" and ref[0] else ""
        )
        print(
            f"{model:34} {engine:10} {place:12} {_fmt(dec):>8} {_fmt(pp):>9} {peer:>25} "
            f"{ratios[0]:>9} {ratios[1]:>6}  {extra}"
        )
    print("targets (issue 16): resident Q4_K decode >= 1.5x; under the budget decode >= 3x "
          "(Q4_K) / 2x (bf16 Qwen1.5) and pp8192 >= 3x llama.cpp's (ok / <).")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/vs_llamacpp.jsonl")
