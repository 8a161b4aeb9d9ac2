"""bench/trace_summary.py on a synthetic Chrome trace: per-step kernel times, launches,
busy time and span, from gzip or plain JSON."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_summary_of_two_steps(tmp_path):
    sys.path.insert(0, str(BENCH))
    from trace_summary import load_kernels, summarize

    def kernel(name, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}

    events = [  # two steps of: gemv 30 µs, norm 10 µs, with 10 µs gaps; plus a host op
        kernel("gemv", 0, 30), kernel("norm", 40, 10), kernel("gemv", 60, 30),
        kernel("norm", 100, 10), {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0,
                                  "dur": 500},
    ]  # fmt: skip
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    kernels = load_kernels(path)
    assert len(kernels) == 4
    lines = summarize(kernels, steps=2, top=5)
    assert lines[2] == "| gemv | 0.030 | 1 |" and lines[3] == "| norm | 0.010 | 1 |"
    assert lines[-1].endswith("GPU busy 0.040 ms of a 0.055 ms span per step")
    plain = tmp_path / "t.json"
    plain.write_text(json.dumps({"traceEvents": events}))
    assert load_kernels(plain) == kernels


def test_beside_splits_a_kernel_by_overlap_with_another():
    sys.path.insert(0, str(BENCH))
    from trace_summary import beside

    def kernel(name, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}

    kernels = [  # gemv alone 15 µs twice; beside a 300 µs fill 170 µs; a 1 µs fill ignored
        kernel("gemv", 0, 15), kernel("fill", 20, 1), kernel("gemv", 22, 15),
        kernel("fill", 100, 300), kernel("gemv", 101, 170), kernel("norm", 500, 2),
    ]  # fmt: skip
    lines = beside(kernels, "fill", min_us=20)
    assert lines[2] == "| gemv | 15.0 (2) | 170.0 (1) |"
    assert len(lines) == 3  # norm never overlapped a fill: not listed


def test_streams_split_busy_time_and_name_the_main_streams_waits():
    sys.path.insert(0, str(BENCH))
    from trace_summary import streams

    def kernel(name, ts, dur, stream):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
                "args": {"stream": stream}}  # fmt: skip

    # one step: main runs select, waits 40 µs for the side stream's fill, then lookup, gemv
    kernels = [
        kernel("select", 0, 5, 7), kernel("lookup", 45, 5, 7), kernel("gemv", 51, 20, 7),
        kernel("fill", 0, 44, 9),
    ]  # fmt: skip
    lines = streams(kernels, steps=1)
    assert lines[2] == "| 7 | 0.030 | 3 | gemv 0.020, select 0.005, lookup 0.005 |"
    assert lines[3] == "| 9 | 0.044 | 1 | fill 0.044 |"
    assert lines[4] == "\nbusiest stream idle 0.041 ms per step; the largest gaps:"
    assert lines[7] == "| select | lookup | 0.040 |" and lines[8] == "| lookup | gemv | 0.001 |"
