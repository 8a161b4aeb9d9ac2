"""bench_prefix_cache.py end to end on the CPU with a tiny model: the cached second turn
computes fewer tokens than the cold one and the table is written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tiny_models import make_hf_model, write_checkpoint

ROOT = Path(__file__).parents[2]


def test_bench_prefix_cache_on_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "bench_prefix_cache", ROOT / "bench/bench_prefix_cache.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model = write_checkpoint(make_hf_model("qwen3_moe"), tmp_path / "m")
    out = tmp_path / "prefix"
    rows = bench.main([
        "--model", str(model), "--device", "cpu", "--dtype", "float32", "--rates", "0,0.5",
        "--max-model-len", "512",
        "--turn1-tokens", "200", "--answer", "8", "--question-tokens", "8", "--repeats", "1",
        "--out", str(out),
    ])  # fmt: skip
    assert [r["rate"] for r in rows] == ["0", "0.5"]
    for r in rows:
        assert r["prompt_tokens"] == 216 and r["hit_rate"] > 0
    assert rows[1]["gb_moved_warm"] <= rows[1]["gb_moved_cold"]
    assert "| 0.5 | 216 |" in out.with_suffix(".md").read_text()
