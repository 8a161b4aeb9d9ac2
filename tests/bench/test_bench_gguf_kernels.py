"""bench/bench_gguf_kernels.py (run on the GPU machine): the `ggufkernel` phase of
scripts/gpu_run.sh passes only options the script takes, with each of its switches set."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from gpu_run_phases import gpu_run_args

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_gguf_kernels as bench  # noqa: E402


@pytest.mark.parametrize(
    "env, want",
    [
        ({}, {}),
        ({"GGUF_TYPES": "Q8_0", "GGUF_SWEEP": "1"}, {"types": "Q8_0", "sweep": True}),
        ({"GGUF_WORDS_SWEEP": "1"}, {"words_sweep": True}),
        ({"GGUF_Q4KM_QKV": "1"}, {"q4_k_m_qkv": True}),
    ],
)
def test_the_phase_passes_options_the_script_takes(env: dict, want: dict) -> None:
    args = bench.build_parser().parse_args(gpu_run_args("ggufkernel", "bench_gguf_kernels.py", env))
    assert args.out == "/tmp/out/gguf_kernels.jsonl"
    for key, value in want.items():
        assert getattr(args, key) == value
