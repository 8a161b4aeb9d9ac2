"""Split-K decode linears adding their partials in each output tile's last split
(`gemv.reduce_when_last`, `gemv_launch.split_tail`) in Triton's CPU interpreter: for the
float skinny GEMM, two quantized formats (block FP8, GPTQ) and two GGUF types, with and
without bias, the output equals, bit for bit, the two-launch path's (partials, then
`gemv_split_reduce_kernel`); no reduce launch is left; the counters are zero after each call;
a call with more tiles than counters reduces apart, with the same bits. (The GPU's memory
ordering is `test_split_reduce_gpu.py`'s.)

Runs in a child pytest with TRITON_INTERPRET=1 (see interpreter_child.py)."""

from __future__ import annotations

import pytest
import torch
from fused_tails import assert_counters_zero
from interpreter_child import child_only, interpreter_child_test, require_interpreted
from linear_families import LINEARS, run_reduced

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(scope="module")
def gl():
    from xinfer.kernels import gemv_launch
    from xinfer.kernels.triton import gemv

    require_interpreted(gemv.gemv_kernel)
    return gemv_launch


@child_only
@pytest.mark.parametrize("family", LINEARS)
# one row without bias, five with (the bias is added by whichever program finishes a tile,
# the same code at any row count)
@pytest.mark.parametrize("rows,bias", [(1, False), (5, True)], ids=["1-no-bias", "5-bias"])
def test_fused_split_reduce_has_the_reduce_kernels_bits(gl, monkeypatch, family, rows, bias):
    call = LINEARS[family](rows, bias, seed=rows + 10 * bias)
    apart, launches_apart = run_reduced(gl, monkeypatch, call, fused=False)
    fused, launches_fused = run_reduced(gl, monkeypatch, call, fused=True)
    assert (launches_apart, launches_fused) == (1, 0), "the call must split K"
    assert torch.equal(fused, apart)
    assert_counters_zero(torch.device("cpu"))
    again, _ = run_reduced(gl, monkeypatch, call, fused=True)
    assert torch.equal(again, apart)


@child_only
def test_more_tiles_than_counters_reduce_apart(gl, monkeypatch) -> None:
    from xinfer.kernels import arrivals

    call = LINEARS["float"](3, True, seed=1)
    reference, _ = run_reduced(gl, monkeypatch, call, fused=False)
    device = torch.device("cpu")
    monkeypatch.setitem(
        arrivals._by_lane, (device, arrivals.MAIN), torch.zeros(1, dtype=torch.int32)
    )
    out, launches = run_reduced(gl, monkeypatch, call, fused=True)
    assert launches == 1 and torch.equal(out, reference)
