"""The decode MoE GEMVs' fused combine (`fused_moe.combine_when_last`, `moe_launch.combine_tail`)
in Triton's CPU interpreter: for the bf16, quantized (FP8, GPTQ) and GGUF down kernels, the
output with the combine summed by each token tile's last program equals, bit for bit, the
output of the separate combine kernel; no combine launch is left; the arrival counters are
all zero again after every call; a call too large for the counters combines apart, with the
same bits. (The interpreter runs programs one after another, so it checks the arithmetic and
the counting, not the GPU's memory ordering: `tests/kernels/test_moe_kernels.py` does that on
the H200.)

Runs in a child pytest with TRITON_INTERPRET=1 (see interpreter_child.py)."""

from __future__ import annotations

import pytest
import torch
from fused_tails import assert_counters_zero
from interpreter_child import child_only, interpreter_child_test, require_interpreted
from moe_families import FAMILIES, run_combined

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(scope="module")
def ml():
    from xinfer.kernels import moe_launch
    from xinfer.kernels.triton import fused_moe as moe_jit

    require_interpreted(moe_jit.moe_down_gemv_kernel)
    return moe_launch


# every family at top-2 (groups of two arrivals); top-1 (a group of one: the first arrival
# finishes) in one family, the combine's code being the same in all
CASES = [pytest.param(f, 3, 2, id=f"3-2-{f}") for f in FAMILIES]
CASES.append(pytest.param("gptq", 4, 1, id="4-1-gptq"))


@child_only
@pytest.mark.parametrize("family,tokens,top_k", CASES)
def test_fused_combine_has_the_separate_combines_bits(ml, monkeypatch, family, tokens, top_k):
    dtype = torch.float16 if family == "float-kernels" else torch.float32
    call = FAMILIES[family](tokens, top_k, dtype, seed=tokens * 10 + top_k)
    apart, launches_apart = run_combined(ml, monkeypatch, call, fused=False)
    fused, launches_fused = run_combined(ml, monkeypatch, call, fused=True)
    assert (launches_apart, launches_fused) == (1, 0)
    assert torch.equal(fused, apart)
    assert_counters_zero(torch.device("cpu"))
    again, _ = run_combined(ml, monkeypatch, call, fused=True)  # the next launch starts from zeros
    assert torch.equal(again, apart)


@child_only
def test_a_call_larger_than_the_counters_combines_apart(ml, monkeypatch) -> None:
    from xinfer.kernels import arrivals

    call = FAMILIES["float-kernels"](3, 2, torch.float32, seed=4)
    reference, _ = run_combined(ml, monkeypatch, call, fused=False)
    device = torch.device("cpu")
    # 3 tokens x cdiv(37, 16) = 9 tiles needed; 8 counters
    monkeypatch.setitem(
        arrivals._by_lane, (device, arrivals.MAIN), torch.zeros(8, dtype=torch.int32)
    )
    out, launches = run_combined(ml, monkeypatch, call, fused=True)
    assert launches == 1 and torch.equal(out, reference)
    assert not arrivals._by_lane[device, arrivals.MAIN].any()


class _FakeOut:
    """Just the `device` and `shape` that `combine_tail` reads (no CUDA here)."""

    def __init__(self, device: torch.device, shape: tuple[int, int]) -> None:
        self.device, self.shape = device, shape


def test_no_counters_are_made_inside_a_cuda_graph_capture(monkeypatch) -> None:
    """Counters made during a capture would come from the graph's pool and die with it: the
    first call inside a capture combines apart instead (the same bits)."""
    from xinfer.kernels import arrivals, moe_launch

    device = torch.device("cuda", 5)  # never allocated: the capture check comes first
    monkeypatch.setattr(arrivals, "_capturing", lambda d: d == device)
    _, fused = moe_launch.combine_tail(_FakeOut(device, (1, 64)), 16)
    assert fused is False and (device, arrivals.MAIN) not in arrivals._by_lane


def test_each_lane_has_counters_of_its_own(monkeypatch) -> None:
    """Launches beside the decode step on another stream (the prefetch predictor) count in
    a lane of their own: two tensors, never the main lane's; the lane ends with its block."""
    from xinfer.kernels import arrivals

    monkeypatch.setattr(arrivals, "_by_lane", {})
    device = torch.device("cpu")
    main = arrivals.counters(device, 4)
    with arrivals.lane("prefetch"):
        side = arrivals.counters(device, 4)
        assert arrivals.counters(device, 4) is side
    assert side is not main and arrivals.counters(device, 4) is main
    assert set(arrivals._by_lane) == {(device, arrivals.MAIN), (device, "prefetch")}
