"""bench/bench_quant.py: the `quantres` and `quanttrace` phases of scripts/gpu_run.sh pass
only options the script takes; the traced phase writes its traces where results come back."""

from __future__ import annotations

import sys
from pathlib import Path

from gpu_run_phases import gpu_run_args

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_quant_phases_match_the_script():
    """`quantres` and `quanttrace` (scripts/gpu_run.sh) pass only options bench_quant.py takes;
    the traced phase writes its traces where the results come back from."""
    import bench_quant

    for phase in ("quantres", "quanttrace"):
        args = bench_quant.build_parser().parse_args(gpu_run_args(phase, "bench_quant.py"))
        assert args.parts == "resident" and set(args.formats.split(",")) <= set(
            bench_quant.QUANT_CONFIGS
        )
    traced = bench_quant.build_parser().parse_args(gpu_run_args("quanttrace", "bench_quant.py"))
    assert traced.trace_dir == "/tmp/out"
