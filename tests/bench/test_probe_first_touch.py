"""bench/probe_first_touch.py runs on CPU at a small size (the figures that matter come from
the GPU host; this keeps the probe from rotting)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import probe_first_touch  # noqa: E402

from xinfer.host_memory import resident_bytes  # noqa: E402


def test_probe_times_every_way_of_touching_pages(capsys, tmp_path):
    out = tmp_path / "touch.json"
    rows = probe_first_touch.main(["--gb", "0.05", "--threads", "1,2", "--json", str(out)])
    assert len(rows) == 6 and out.exists()
    for r in rows:
        if "error" in r:  # a kernel older than 5.14 has no MADV_POPULATE_WRITE
            assert "MADV_POPULATE_WRITE" in r["what"]
            continue
        assert r["seconds"] > 0 and r["gb_s"] > 0 and r["rewrite_gb_s"] > 0
    assert capsys.readouterr().out.count("\n| ") == 7  # header + six rows


def test_populate_faults_every_page_in():
    t = probe_first_touch.fresh_mapping(64 << 20, huge=False)
    before = resident_bytes()
    try:
        probe_first_touch.populate(t, 3)
    except OSError:  # no MADV_POPULATE_WRITE on this kernel (< 5.14)
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    if before is None:
        pytest.skip("no /proc/self/statm to read resident memory from")
    assert resident_bytes() - before >= 0.9 * t.numel()
