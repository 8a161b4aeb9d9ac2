"""The tensor-core dots of the quantized-weight kernels as Triton compiles them for sm_90, on
CPU (`triton_compile.lower` to TTIR and TTGIR: no ptxas, no GPU), at the tiles their
launchers pick on the GPU.

Why: the 4-bit tile loaders (`triton/quant_dequant.load_raw_tile3`: GPTQ, AWQ,
compressed-tensors int4, NVFP4) unpack each byte's two codes with `tl.join` before the
weight tile reaches `tl.dot` (`quant_gemm.quant_linear_kernel`, the grouped MoE GEMMs of
`quant_moe`). Triton 3.6 (the GPU machine's) halves the loaded 8 bits for a join among a dot
operand's producers, so these MMAv2 dots get kWidth 8, and an MMAv2 operand of kWidth w
spans 4w elements along K: with K < 32 Triton 3.6 sums the wrong elements (the fault that
decoded wrong tokens in the turbo attention kernels, `test_kv_turbo_compile.py`). The tiles
the launchers pick have K 64 to 256, past it; these tests keep it so for every format with
dot kernels (FP8's 8-bit loads, without a join, give kWidth 4: K >= 16) and for the GGUF
dot kernels (their nibbles unpacked by shifts, no join). CI's Triton (3.9) gives these dots
kWidth 4 whatever the join, so each dot is also checked at the kWidth 3.6 would give it,
modelled from the TTIR (`ttgir_dots`; under Triton 3.6 checked against what it compiled).

Each case calls a launcher with small CPU tensors under `compile_only` (nothing runs) and
asserts the dots each dot kernel must have (by MMA version: v2 mma.sync, v3 wgmma, which
has no kWidth, or FMA for float32 activations); the 16-row tiles are MMAv2 (wgmma takes 64
rows a warp group), so every case with one checks at least one MMAv2 dot."""

from __future__ import annotations

import collections
from unittest import mock

import pytest
from interpreter_child import IS_CHILD

triton = pytest.importorskip("triton")
import ttgir_dots as td  # noqa: E402
from compile_cases.base import BF16, F16, F32, _randn  # noqa: E402
from compile_cases.quantized import (  # noqa: E402
    _formats,
    _gguf_linear,
    _gguf_moe,
    _quant_linear,
    _quant_moe,
    _quant_weights,
)

from xinfer.kernels import quant_launch  # noqa: E402

pytestmark = pytest.mark.skipif(
    IS_CHILD, reason="compiles the kernels: needs a process without TRITON_INTERPRET=1"
)

TRITON_36 = triton.__version__.split(".")[:2] == ["3", "6"]  # the modelled kWidth's version

# the formats of `compile_cases.quantized._formats` (FP8 block and per-channel; GPTQ with and
# without zeros, per-row and groups of 96 that tiles straddle; AWQ; compressed-tensors groups
# of 32; NVFP4)
QUANT_FORMATS = [
    "fp8-block128", "fp8-per-channel", "fp8-block128x96", "gptq-g128-sym", "gptq-g128-asym",
    "gptq-per-row-sym", "gptq-g96-sym", "awq-g128", "ct-g32-asym-bf16", "nvfp4",
]  # fmt: skip
GGUF_TYPES = ["Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]

LINEAR, GGUF_LINEAR = "quant_linear_kernel", "gguf_linear_kernel"
GATE_UP, DOWN = "quant_moe_gate_up_grouped_kernel", "quant_moe_down_grouped_kernel"
GGUF_GATE_UP, GGUF_DOWN = "gguf_moe_gate_up_grouped_kernel", "gguf_moe_down_grouped_kernel"


def _decode_dot(launch):
    """`launch` with the decode linears on the 16-row dot tile (DECODE_GEMV off)."""

    def run(*args, **kwargs) -> None:
        with mock.patch.object(quant_launch, "DECODE_GEMV", False):
            launch(*args, **kwargs)

    return run


# path → (launcher call taking the format or block type, {kernel: {MMA version: dots}});
# the launchers pick the tiles (M x N x K: quant_launch.linear_tiles / grouped_tiles,
# gguf_tiles')
QUANT_PATHS = {
    # decode linear, the 16-row dot tile: 16 x 32 x 256 (4-bit) or 128 (FP8)
    "linear-bf16-m4-dot": (lambda f: _decode_dot(_quant_linear)(f, BF16, 4), {LINEAR: {2: 1}}),
    # linears below PREFILL_MIN_ROWS (and above, asked in registers): 64 x 64 x 64
    "linear-bf16-m32": (lambda f: _quant_linear(f, BF16, 32, dequant=False), {LINEAR: {3: 1}}),
    # float32 activations: no tensor cores ("ieee" precision), 32 x 32 x 32
    "linear-fp32-m32": (lambda f: _quant_linear(f, F32, 32, dequant=False), {LINEAR: {0: 1}}),
    # expert calls up to PREFILL_MIN_PAIRS pairs: 16 x 64 x 128
    "moe-bf16-320-pairs": (
        lambda f: _quant_moe(f, BF16, 40, False, dequant=False),
        {GATE_UP: {2: 2}, DOWN: {2: 1}},
    ),
    # past PREFILL_MIN_PAIRS in registers: the format's `moe_prefill_tiles` (int4: 128 x 64 x
    # 64) or 64 x 64 x 64
    "moe-fp16-1040-pairs": (
        lambda f: _quant_moe(f, F16, 130, False, dequant=False),
        {GATE_UP: {3: 2}, DOWN: {3: 1}},
    ),
}
GGUF_PATHS = {
    # decode linear, the 16-row dot tile: 16 x 16 x 256
    "linear-bf16-m4-dot": (lambda t: _decode_dot(_gguf_linear)(t, BF16, 4), {GGUF_LINEAR: {2: 1}}),
    # linears of 17 to 127 rows: 64 x 64 x 64
    "linear-bf16-m32": (lambda t: _gguf_linear(t, BF16, 32), {GGUF_LINEAR: {3: 1}}),
    # expert calls up to 1024 pairs: 16 x 64 x 128
    "moe-bf16-320-pairs": (
        lambda t: _gguf_moe(t, t, BF16, 40, False),
        {GGUF_GATE_UP: {2: 2}, GGUF_DOWN: {2: 1}},
    ),
    # past 1024 pairs: the swept tile (Q4_K 64 x 64 x 64, Q8_0 64 x 64 x 128) or 64 x 64 x 64
    "moe-bf16-1040-pairs": (
        lambda t: _gguf_moe(t, t, BF16, 130, False, dequant=False),
        {GGUF_GATE_UP: {3: 2}, GGUF_DOWN: {3: 1}},
    ),
}


def _check(launch, expected: dict[str, dict[int, int]], joined: bool | None) -> None:
    """The dots of each kernel in `expected` are of the MMA versions it says (so none passes
    by having none), and every MMAv2 dot has 4 kWidth <= K (`ttgir_dots.mmav2_faults`);
    `joined`: whether a tt.join feeds the dots (None: either)."""
    kernels = td.lowered(launch, only=set(expected))
    faults, report = [], []
    for kernel, versions in expected.items():
        assert kernel in kernels, f"{kernel} not compiled (compiled: {sorted(kernels)})"
        found = td.dots(kernels[kernel])
        report.append(f"{kernel}: {', '.join(map(str, found))}")
        counts = dict(collections.Counter(dot.version for dot in found))
        assert counts == versions, f"{kernel}: dots by MMA version {counts}, not {versions}"
        faults += td.mmav2_faults(kernel, found)
        for dot in found:
            if joined is not None:
                assert dot.joined == joined, f"{kernel}: {dot}: join expected {joined}"
            if TRITON_36 and dot.version == 2:  # the model is 3.6's choice
                assert dot.kwidth == dot.kwidth_36, f"{kernel}: {dot}: 3.6's model is off"
    print("\n".join(report))
    assert not faults, "\n".join(faults + ["(see the module docstring)"] + report)


@pytest.mark.parametrize("path", list(QUANT_PATHS))
@pytest.mark.parametrize("fmt", QUANT_FORMATS)
def test_quant_dots_take_their_kwidth(fmt, path):
    """The quantized formats' dot kernels: the 4-bit formats' weight tiles joined from
    nibbles (3.6: kWidth 8 on the MMAv2 dots, K 128 and 256), FP8's not (kWidth 4)."""
    launch, expected = QUANT_PATHS[path]
    _check(lambda: launch(fmt), expected, joined=not fmt.startswith("fp8"))


@pytest.mark.parametrize("path", list(GGUF_PATHS))
@pytest.mark.parametrize("btype", GGUF_TYPES)
def test_gguf_dots_take_their_kwidth(btype, path):
    """The GGUF dot kernels: no join (kWidth 4 from the byte loads), K 64 to 256."""
    launch, expected = GGUF_PATHS[path]
    _check(lambda: launch(btype), expected, joined=False)


def test_gguf_q4k_head_dot_takes_its_kwidth():
    """The swept Q4_K LM-head tile (N >= gguf_tiles.HEAD_ROWS) where the word path is off, a
    16-row dot tile at decode whatever DECODE_GEMV: 16 x 16 x 64, one warp."""
    launch = lambda: _gguf_linear("Q4_K", BF16, 1, n=65536, words=False)  # noqa: E731
    _check(launch, {GGUF_LINEAR: {2: 1}}, joined=False)


@pytest.mark.parametrize("fmt, width_36", [("gptq-g128-sym", 8), ("nvfp4", 8), ("fp8-block128", 4)])
def test_a_16_column_tile_is_caught(fmt, width_36):
    """The check sees the fault under any Triton: a decode dot tile of 16 columns (not one a
    launcher picks) of a 4-bit format gets 3.6's kWidth 8 > 16 / 4 and is reported; FP8's
    kWidth 4 fits."""
    tiles = quant_launch.QuantTiles(block_m=16, block_n=32, block_k=16)

    def launch() -> None:
        n, k = 256, 1024
        x = _randn(4, k, dtype=BF16)
        quant_launch.linear(x, _formats()[fmt], _quant_weights(fmt, n, k), None, n, k,
                            tiles=tiles)  # fmt: skip

    found = td.dots(td.lowered(launch)[LINEAR])
    assert [(d.version, d.m, d.k, d.kwidth_36) for d in found] == [(2, 16, 16, width_36)]
    if TRITON_36:
        assert found[0].kwidth == width_36
    faults = td.mmav2_faults(LINEAR, found)
    assert bool(faults) == (width_36 == 8), faults
