"""bench/bench_kv_turbo.py's variants off the GPU: each sets the turbo switches of
`attn_launch` it names on top of the defaults (`base` restores them), a part it does not
know stops the run before anything is timed, and scripts/gpu_run.sh's `turbobench` phase
passes only options and variants the script takes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from gpu_run_phases import gpu_run_args

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_variants_set_the_turbo_switches_and_base_restores_them():
    import bench_kv_turbo as bench

    from xinfer.kernels import attn_launch

    try:
        bench.set_variant("shuffle,stages2,split64")
        assert attn_launch.TURBO_LOOKUP_SHUFFLE is True
        want = {**attn_launch.DECODE_CONFIGS[-1][1], "num_stages": 2, "SPLIT_LEN": 64}
        assert attn_launch.TURBO_DECODE_CONFIG == want
        bench.set_variant("block16")
        assert attn_launch.TURBO_LOOKUP_SHUFFLE is False
        assert attn_launch.TURBO_DECODE_CONFIG["BLOCK_N"] == 16
    finally:
        bench.set_variant("base")
    assert attn_launch.TURBO_LOOKUP_SHUFFLE is False and attn_launch.TURBO_DECODE_CONFIG is None
    with pytest.raises(SystemExit, match="unknown variant part 'stages'"):
        bench.set_variant("stages")


def test_the_gpu_run_phase_names_only_known_options_and_variants():
    import bench_kv_turbo as bench

    args = bench.build_parser().parse_args(gpu_run_args("turbobench", "bench_kv_turbo.py"))
    try:
        for variant in args.variants.split(";"):
            bench.set_variant(variant)
    finally:
        bench.set_variant("base")
    assert set(args.kinds.split(",")) <= {"bf16", "fp8", "turbo4", "turbo3"}
