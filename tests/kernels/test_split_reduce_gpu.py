"""Split-K decode linears adding their partials in each output tile's last split
(`gemv.reduce_when_last`) on the GPU, where the last split reads the others' partials after
an acquire on its tile's counter — what the CPU interpreter (one program at a time) cannot
test. At the Qwen3-30B-A3B o_proj shape (2048 x 4096) for every family: bit-equal to the
reduce kernel's output on many launches in a row, counters zero after, and the same bits
replayed from a CUDA graph. All `gpu`: skipped without CUDA."""

from __future__ import annotations

import pytest
from fused_tails import assert_graph_replays, assert_launches_repeat
from linear_families import LINEARS, run_reduced

pytestmark = pytest.mark.gpu


@pytest.fixture
def run(monkeypatch):
    pytest.importorskip("triton")
    from xinfer.kernels import gemv_launch

    return lambda call, fused: run_reduced(gemv_launch, monkeypatch, call, fused)


@pytest.mark.parametrize("family", LINEARS)
@pytest.mark.parametrize("rows,bias", [(1, False), (16, True)])
def test_fused_split_reduce_has_the_reduce_kernels_bits(run, family, rows, bias) -> None:
    call = LINEARS[family](rows, bias, seed=rows, device="cuda", large=True)
    assert_launches_repeat(run, call)  # the large shapes split K at decode sizes


@pytest.mark.parametrize("family", ["float", "fp8", "gguf-q4_k"])
def test_fused_split_reduce_replays_in_a_cuda_graph(run, family) -> None:
    assert_graph_replays(run, LINEARS[family](1, True, seed=3, device="cuda", large=True))
