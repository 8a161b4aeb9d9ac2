"""bench/bench_decode_switches.py: the `switches` phase of scripts/gpu_run.sh passes only
options the script takes and names only switches it knows; each variant sets its flags and
the next one starts again from the defaults."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gpu_run_phases import gpu_run_args

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_switches_phase_matches_the_script():
    import bench_decode_switches as bench

    args = bench.build_parser().parse_args(gpu_run_args("switches", "bench_decode_switches.py"))
    defaults = bench.current_switches()
    try:
        for variant in args.variants.split(";"):
            bench.set_variant(variant, defaults)
    finally:
        bench.set_variant("base", defaults)
    assert bench.current_switches() == defaults


def test_a_variant_flips_its_flags_and_the_next_starts_from_the_defaults():
    import bench_decode_switches as bench

    from xinfer.kernels import attn_launch, pdl, router_launch

    defaults = bench.current_switches()
    try:
        bench.set_variant("pdl,router", defaults)
        assert pdl.ENABLED and router_launch.ENABLED
        bench.set_variant("merge,router-apart", defaults)
        assert attn_launch.FUSED_DECODE_REDUCE and not router_launch.ENABLED
        assert pdl.ENABLED == defaults[id(pdl), "ENABLED"][2]
        bench.set_variant("qkv-gemv", defaults)
        from xinfer.kernels import gemv_launch

        assert gemv_launch.select(5120, 2048, 1, torch.bfloat16) is not None
        with pytest.raises(SystemExit, match="unknown switch"):
            bench.set_variant("pdl,fast", defaults)
    finally:
        bench.set_variant("base", defaults)
    assert bench.current_switches() == defaults
