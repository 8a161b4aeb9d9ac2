"""Split-K decode linears adding their partials in each output tile's last split
(`gemv.reduce_when_last`) on the GPU, where the last split reads the others' partials after
an acquire on its tile's counter — what the CPU interpreter (one program at a time) cannot
test. At the Qwen3-30B-A3B o_proj shape (2048 x 4096) for every family: bit-equal to the
reduce kernel's output on many launches in a row, counters zero after, and the same bits
replayed from a CUDA graph. All `gpu`: skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from linear_families import LINEARS, run_reduced

from xinfer.kernels import arrivals

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gl():
    pytest.importorskip("triton")
    from xinfer.kernels import gemv_launch

    return gemv_launch


@pytest.mark.parametrize("family", LINEARS)
@pytest.mark.parametrize("rows,bias", [(1, False), (16, True)])
def test_fused_split_reduce_has_the_reduce_kernels_bits(gl, monkeypatch, family, rows, bias):
    call = LINEARS[family](rows, bias, seed=rows, device="cuda", large=True)
    apart, launches = run_reduced(gl, monkeypatch, call, fused=False)
    assert launches == 1, "the o_proj shape splits K at decode sizes"
    outs = []
    for _ in range(50):
        out, launches = run_reduced(gl, monkeypatch, call, fused=True)
        assert launches == 0
        outs.append(out)
    torch.cuda.synchronize()
    for i, out in enumerate(outs):
        assert torch.equal(out, apart), f"launch {i}: {(out != apart).sum().item()} values differ"
    assert not arrivals._by_device[apart.device].any()


@pytest.mark.parametrize("family", ["float", "fp8", "gguf-q4_k"])
def test_fused_split_reduce_replays_in_a_cuda_graph(gl, monkeypatch, family) -> None:
    call = LINEARS[family](1, True, seed=3, device="cuda", large=True)
    apart, _ = run_reduced(gl, monkeypatch, call, fused=False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compiles, and makes the counters, outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for _ in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, apart)
    assert not arrivals._by_device[apart.device].any()
