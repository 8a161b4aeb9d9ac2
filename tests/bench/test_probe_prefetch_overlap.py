"""bench/probe_prefetch_overlap.py runs end to end on the GPU: its fills move the right bytes
(the probe asserts them), every row is timed and what it saves is what it returned; the
`overlapprobe` phase of scripts/gpu_run.sh parses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


@pytest.mark.gpu
def test_probe_rows_on_the_gpu(tmp_path):
    import probe_prefetch_overlap

    rows = probe_prefetch_overlap.main(
        ["--programs", "8,132", "--misses", "1", "--experts", "16", "--reps", "3",
         "--json", str(tmp_path / "p.json")]
    )  # fmt: skip
    assert [r["fill"] for r in rows] == ["fill kernel, 8 programs", "fill kernel, 132 programs",
                                         "copy engine"]  # fmt: skip
    words = int(2.43e6) // 4 // 1024 * 1024  # one expert of the default --expert-mb
    for r in rows:
        assert r["mb"] == words * 4 / 1e6
        assert r["fill_alone_us"] > 0 and r["fill_together_us"] > 0
        assert r["compute_alone_us"] > 0 and r["compute_together_us"] > 0
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["rows"] == rows and saved["compute_alone_us"] == rows[0]["compute_alone_us"]


def test_the_gpu_phase_parses():
    """`overlapprobe` (scripts/gpu_run.sh) passes only options the probe takes, OVERLAP_ARGS
    included, and writes its JSON where the results come back from."""
    import probe_prefetch_overlap
    from gpu_run_phases import gpu_run_args

    parse = probe_prefetch_overlap.build_parser().parse_args
    args = parse(gpu_run_args("overlapprobe", "probe_prefetch_overlap.py"))
    assert args.json == "/tmp/out/prefetch_overlap.json" and args.programs == "8,16,32,66,132,264"
    assert args.eager == "compute,fill"  # graph replays side by side faulted (its docstring)
    env = {"OVERLAP_ARGS": "--programs 16 --misses 2 --expert-mb 9.44"}
    args = parse(gpu_run_args("overlapprobe", "probe_prefetch_overlap.py", env))
    assert (args.programs, args.misses, args.expert_mb) == ("16", "2", 9.44)
