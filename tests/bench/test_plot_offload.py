"""bench/plot_offload.py on a synthetic benchmark JSON: the lines per batch (one per prefetch
setting, the limits of the prefetch-off rows, the resident tok/s), the merge of several
files, and a PNG written (where matplotlib is installed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import plot_offload as plot  # noqa: E402
from offload_bench import decode_report as rep  # noqa: E402


def _row(rate, batch, step_ms, prefetch=0, misses=0, prefetched=0):
    """A row of 10 steps that missed `misses` GB and prefetched `prefetched` GB a step."""
    return {
        "rate": rate, "batch": batch, "step_ms": step_ms, "prefetch": prefetch, "steps": 10,
        "hits": 100, "misses": 10 * misses, "bytes_copied": 1e10 * misses,
        "bytes_moved": 1e10 * (misses + prefetched), "prefetch_prefetched_bytes": 1e10 * prefetched,
        "slots": [13 if rate == "0.1" else 26], "num_experts": 128, "tokens": [[1]] * batch,
    }  # fmt: skip


def _results(tmp_path: Path) -> Path:
    """Resident 4 / 8 ms; at 10% and 20%, prefetch off and 1 ahead; B = 50 GB/s."""
    rows = [
        _row("0", 1, 4.0), _row("0", 8, 8.0),
        _row("0.1", 1, 14.0, misses=5), _row("0.1", 1, 11.0, prefetch=1, misses=2, prefetched=4),
        _row("0.2", 1, 9.0, misses=2), _row("0.2", 1, 8.0, prefetch=1, misses=1, prefetched=2),
        _row("0.1", 8, 30.0, misses=10), _row("0.2", 8, 20.0, misses=5),
        {"rate": "0.35", "batch": 8, "error": "out of memory"},  # did not run: left out
    ]  # fmt: skip
    rep.add_limits(rows, 50.0)
    meta = {"model": "bench/configs/qwen3_30b_a3b", "gpu": "H200", "routing": "qwen3-30b-a3b",
            "bandwidth_gbps": 50.0}  # fmt: skip
    path = tmp_path / "offload.json"
    path.write_text(json.dumps({"meta": meta, "decode": rows}))
    return path


def test_series_per_batch(tmp_path):
    rows, meta = plot.load([_results(tmp_path)])
    assert meta["routing"] == "qwen3-30b-a3b" and len(rows) == 8
    lines = plot.series(rows)
    assert list(lines) == [1, 8]
    one = lines[1]
    x10, x20 = 13 / 128, 26 / 128
    assert one[plot.RESIDENT] == [(1.0, 250.0)]
    assert one["prefetch off"] == [(x10, pytest.approx(1000 / 14)), (x20, pytest.approx(1000 / 9))]
    assert one["prefetch 1 ahead"] == [(x10, pytest.approx(1000 / 11)), (x20, 125.0)]
    # the prefetch-off rows' limits: 5 GB a step = 100 ms at 50 GB/s, 2 GB = 40 ms
    assert one[plot.SERIAL] == [(x10, pytest.approx(1000 / 104)), (x20, pytest.approx(1000 / 44))]
    assert one[plot.OVERLAPPED] == [(x10, pytest.approx(10.0)), (x20, pytest.approx(25.0))]
    assert set(lines[8]) == {plot.RESIDENT, "prefetch off", plot.SERIAL, plot.OVERLAPPED}


def test_later_files_replace_rows(tmp_path):
    first = _results(tmp_path)
    again = tmp_path / "again.json"
    data = json.loads(first.read_text())
    data["decode"] = [dict(data["decode"][2], step_ms=7.0, tok_s=1000 / 7)]  # 10%, off, b1
    again.write_text(json.dumps(data))
    rows, _ = plot.load([first, again])
    assert len(rows) == 8
    assert plot.series(rows)[1]["prefetch off"][0][1] == pytest.approx(1000 / 7)


def test_png_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "images" / "offload.png"
    assert plot.main([str(_results(tmp_path)), "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
