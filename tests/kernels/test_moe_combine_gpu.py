"""The decode MoE GEMVs' fused combine on the GPU (`fused_moe.combine_when_last`): each token
tile's last program reads the other programs' y tiles after an acquire on its counter, which
the CPU interpreter (one program at a time) cannot test. Here, at the Qwen3-30B-A3B layer
widths, for every kernel family: the fused output equals the separate combine kernel's bit
for bit on many launches in a row (a missed ordering shows as a stale tile now and then),
the counters are zero after them, and a CUDA graph with the fused launch replays to the
same bits. All `gpu`: skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from moe_families import FAMILIES, run_combined

from xinfer.kernels import arrivals

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ml():
    pytest.importorskip("triton")
    from xinfer.kernels import moe_launch

    return moe_launch


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_fused_combine_has_the_separate_combines_bits(ml, monkeypatch, family, tokens) -> None:
    call = FAMILIES[family](tokens, 8, torch.bfloat16, seed=tokens, device="cuda", large=True)
    apart, launches = run_combined(ml, monkeypatch, call, fused=False)
    assert launches == 1
    outs = []
    for _ in range(50):
        out, launches = run_combined(ml, monkeypatch, call, fused=True)
        assert launches == 0
        outs.append(out)
    torch.cuda.synchronize()
    for i, out in enumerate(outs):
        assert torch.equal(out, apart), f"launch {i}: {(out != apart).sum().item()} values differ"
    assert not arrivals._by_device[apart.device].any()


@pytest.mark.parametrize("family", ["float-kernels", "fp8", "gguf-q4_k-q6_k"])
def test_fused_combine_replays_in_a_cuda_graph(ml, monkeypatch, family) -> None:
    call = FAMILIES[family](4, 8, torch.bfloat16, seed=9, device="cuda", large=True)
    apart, _ = run_combined(ml, monkeypatch, call, fused=False)
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
