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


def test_quantoff_passes_offload_args_last(tmp_path):
    """`quantoff` hands QUANT_OFFLOAD_ARGS to the offload rows' bench_offload_decode.py after
    its own options, so they override them (argparse keeps the last), a lone flag included."""
    import bench_offload_decode
    import bench_quant

    extra = "--rates 0.2 --prefetch 0,1 --prefetch-programs 16 --compress"
    env = {"QUANT_FORMATS": "gptq", "QUANT_OFFLOAD_ARGS": extra}
    args = bench_quant.build_parser().parse_args(gpu_run_args("quantoff", "bench_quant.py", env))
    assert args.parts == "offload" and args.formats == "gptq" and args.offload_args == extra
    argv = bench_quant.offload_argv(args, tmp_path / "gptq", tmp_path / "out")
    inner = bench_offload_decode.build_parser().parse_args(argv)
    assert inner.rates == "0.2" and inner.prefetch == "0,1" and inner.prefetch_programs == 16
    assert inner.compress and inner.batches == "1,8" and inner.model == str(tmp_path / "gptq")
    plain = bench_quant.build_parser().parse_args(gpu_run_args("quantoff", "bench_quant.py"))
    assert bench_quant.offload_argv(plain, tmp_path, tmp_path)[-2:] == ["--out", str(tmp_path)]
