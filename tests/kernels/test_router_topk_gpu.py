"""The router GEMV with its top-k in one launch (`router_launch.router_topk`) on the GPU, where
the last program reads the others' partials after an acquire on the arrival counter — what the
CPU interpreter (one program at a time) cannot test. At the routers of Qwen3-30B-A3B (128 x
2,048), Qwen1.5-MoE (60 x 2,048) and Mixtral (8 x 4,096) in bfloat16, 1, 4 and 16 rows, with
the shipped top-k warps and with one: weights and ids bit-equal to the two launches' (the
skinny GEMM on the same tiles, then `route_topk`) on 50 launches in a row, the counter zero
after, and the same bits replayed from a CUDA graph. All `gpu`: skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from fused_tails import assert_counters_zero

pytestmark = pytest.mark.gpu
ROUTERS = [(128, 2048, 8), (60, 2048, 4), (8, 4096, 2)]  # (E, K, top-k)


@pytest.fixture
def rl():
    pytest.importorskip("triton")
    from xinfer.kernels import router_launch

    return router_launch


def _case(experts: int, k: int, rows: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, k, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(experts, k, generator=g, device="cuda") / k**0.5).to(torch.bfloat16)
    return x, w


def _two_launches(rl, x, w, top_k):
    from xinfer.kernels import gemv_launch, moe_launch

    cfg = rl.config(w.shape[0], w.shape[1], x.shape[0], x.dtype)
    return moe_launch.route_topk(gemv_launch.linear(x, w, config=cfg), top_k, True)


@pytest.mark.parametrize("experts,k,top_k", ROUTERS)
@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("warps", [None, 1])  # None: routing.TOPK_WARPS as shipped
def test_one_launch_has_the_two_launches_bits(rl, experts, k, top_k, rows, warps, monkeypatch):
    from xinfer.kernels.triton import routing

    if warps is not None:  # both paths read it at launch time
        monkeypatch.setattr(routing, "TOPK_WARPS", warps)
    x, w = _case(experts, k, rows, seed=rows)
    want_w, want_i = _two_launches(rl, x, w, top_k)
    outs = [rl.router_topk(x, w, top_k, True) for _ in range(50)]
    torch.cuda.synchronize()
    for i, (got_w, got_i) in enumerate(outs):
        assert torch.equal(got_i, want_i), f"launch {i}: ids differ"
        assert torch.equal(got_w.view(torch.int32), want_w.view(torch.int32)), f"launch {i}"
    assert_counters_zero(x.device)


@pytest.mark.parametrize("experts,k,top_k", ROUTERS[:2])
def test_one_launch_replays_in_a_cuda_graph(rl, experts, k, top_k) -> None:
    x, w = _case(experts, k, 1, seed=7)
    want_w, want_i = _two_launches(rl, x, w, top_k)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rl.router_topk(x, w, top_k, True)  # compiles, and makes the counters, outside
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got_w, got_i = rl.router_topk(x, w, top_k, True)
    for _ in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got_i, want_i) and torch.equal(got_w, want_w)
    assert_counters_zero(x.device)
