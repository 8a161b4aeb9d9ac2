"""bench/bench_vs_llamacpp_table.py: an xinfer row is set beside llama.cpp's row of the same
model and placement from the same run (a budget row whatever its slot policy, llama.cpp's
`-ncmoe` row by the budget its kit computes for that file), the issue's figures otherwise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_vs_llamacpp_table as table  # noqa: E402


def test_budget_rows_pair_with_llamacpp_whatever_the_policy():
    q4 = "qwen3-30b-a3b q4_k"
    assert table._key({"model": q4, "placement": "12 GB auto"}) == (q4, "12 GB")
    assert table._key({"model": q4, "placement": "12 GB auto lfu"}) == (q4, "12 GB")
    assert table._key({"model": q4, "placement": "12 GB auto lru packed"}) == (q4, "12 GB")
    assert table._key({"model": q4, "placement": "-ncmoe 17"}) == (q4, "12 GB")
    assert table._key({"model": "x q8_0", "placement": "-ncmoe 13"}) == ("x q8_0", "24 GB")
    assert table._key({"model": q4 + " isq q4k", "placement": "resident"}) == (q4, "resident")


def test_table_uses_this_runs_llamacpp(tmp_path, capsys):
    q4 = "qwen3-30b-a3b q4_k"
    rows = [
        {"engine": "llama.cpp", "model": q4, "placement": "-ncmoe 17", "decode_tok_s": 100.0},
        {"engine": "llama.cpp", "model": q4, "placement": "-ncmoe 17", "pp8192_tok_s": 2000.0},
        {
            "engine": "xinfer",
            "model": q4,
            "placement": "12 GB auto lfu",
            "decode_tok_s": 250.0,
            "pp8192_tok_s": 20000.0,
        },  # fmt: skip
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table.main(str(path))
    line = next(x for x in capsys.readouterr().out.splitlines() if "12 GB auto lfu" in x)
    assert "(here)" in line and "2.50" in line and "10.00" in line
