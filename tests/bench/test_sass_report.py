"""`bench/sass_report.py`: its SASS parser on a hand-written listing, and the report on the
GGUF MoE GEMV compiled for sm_90 here (Triton's bundled ptxas and nvdisasm, no GPU): the
decode loops must not round-trip through shared memory (a layout conversion with barriers
every iteration, what the activations' broadcast once cost) nor spill registers."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="needs compiled Triton"
)


@pytest.fixture(scope="module")
def sass_report():
    spec = importlib.util.spec_from_file_location("sass_report", ROOT / "bench" / "sass_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sass_report"] = module
    spec.loader.exec_module(module)
    return module


LISTING = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0030*/                   LOP3.LUT R6, R4, 0xf, RZ, 0xc0, !PT ;
        /*0040*/                   FFMA R8, R6, R7, R8 ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0060*/               @P1 BRA `(.L_x_1) ;
.L_x_0:
        /*0070*/                   STG.E [R2.64], R8 ;
        /*0080*/                   EXIT ;
"""


def test_parser_finds_the_loop(sass_report) -> None:
    total, loop = sass_report.parse_sass(LISTING)
    assert total == 9
    assert loop == ["LDG", "LOP3", "FFMA", "BAR", "BRA"]
    kinds = [sass_report._classify(op) for op in loop]
    assert kinds == ["global load", "int/bit", "float fma/mul/add", "barrier", "other"]


@pytest.mark.parametrize("case", ["gguf-q4_k", "gguf-q8_0", "fp8"])
def test_decode_gemv_loops_stay_in_registers(sass_report, case) -> None:
    """The MoE GEMVs of GGUF Q4_K / Q8_0 and FP8 (the unpacked quantized formats)."""
    report = sass_report.compile_to_sass(sass_report.CASES[case]().launch)
    gemvs = [k for k in report if "gemv" in k.name]
    assert len(gemvs) == 2 and {k.name.split("_moe_")[1] for k in gemvs} == {
        "gate_up_gemv_kernel",
        "down_gemv_kernel",
    }
    for k in gemvs:
        assert k.loop > 0 and k.spill_bytes == 0, k
        assert k.loop_kinds.get("barrier", 0) == 0, k
        assert k.loop_kinds.get("shared ld/st", 0) == 0, k


@pytest.mark.parametrize("case", ["gguf-q4_k-q8x", "linear-gguf-q8_0-q8x"])
def test_q8x_loops_multiply_with_dp4a(sass_report, case) -> None:
    """The GEMVs on int8 activations: the inline `dp4a` lowers to IDP in the loop (two a
    code word: Q4_K's low and high nibbles; one a Q8_0 word), without spills."""
    report = sass_report.compile_to_sass(sass_report.CASES[case]().launch)
    assert report and all(k.name.startswith("q8x_") for k in report)
    for k in report:
        assert k.loop > 0 and k.spill_bytes == 0, k
        assert k.loop_ops.get("IDP", 0) >= 8, k


def test_int4_prefill_tile_runs_on_tensor_cores_without_spills(sass_report) -> None:
    """The int4 family's measured in-register prefill tile (`moe_prefill_tiles`, 128 rows of
    8 warps): both grouped GEMMs compile for sm_90 without register spills, with MMA in the
    loop."""
    report = sass_report.compile_to_sass(sass_report.CASES["gptq-prefill"]().launch)
    grouped = [k for k in report if "grouped" in k.name]
    assert len(grouped) == 2
    for k in grouped:
        assert k.num_warps == 8 and k.spill_bytes == 0, k
        assert k.loop_kinds.get("tensor core", 0) > 0, k
