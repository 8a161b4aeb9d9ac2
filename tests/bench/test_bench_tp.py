"""bench/bench_tp.py end to end on CPU ranks (its --cpu smoke mode): a TP=1 and a TP=2 run
with offload on a tiny checkpoint write the JSON and the table, with per-rank slots and
bytes, and the TP=2 greedy tokens equal to TP=1's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tiny_models as tm

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_tp.py"


def test_bench_tp_cpu_smoke(tmp_path):
    path = tm.write_checkpoint(tm.make_hf_model("qwen3_moe", seed=2), tmp_path / "m")
    out = tmp_path / "tp"
    args = ["--cpu", "--model", str(path), "--tp", "1,2", "--rates", "0.5", "--batches", "2"]
    args += ["--steps", "3", "--warmup-steps", "1", "--max-model-len", "256", "--out", str(out)]
    proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads(out.with_suffix(".json").read_text())["runs"]
    assert [(r["tp"], r["rate"]) for r in runs] == [(1, "0.5"), (2, "0.5")]
    assert runs[1]["slots_per_rank"] == [4, 4] and runs[1]["greedy"] == runs[0]["greedy"]
    assert len(runs[1]["rows"][0]["gb_per_step_rank"]) == 2
    table = out.with_suffix(".md").read_text()
    assert "| 2 | 0.5 | 4,4 | 2 |" in table and table.rstrip().endswith("| equal |")
