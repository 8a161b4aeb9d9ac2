"""What the fused-tail tests share (`test_moe_combine_*`, `test_split_reduce_*`): running a
launcher with its fused tail on or off while counting the second launches it makes, and the
GPU checks — many launches in a row and CUDA-graph replays bit-equal to the two-launch path,
the arrival counters back at zero."""

from __future__ import annotations

import torch


def run_switched(module, switch: str, second_launch: str, monkeypatch, call, fused: bool):
    """(output, calls of `module.second_launch`) of `call` with `module.switch` = `fused`."""
    launches = []
    launch = getattr(module, second_launch)
    with monkeypatch.context() as patch:
        patch.setattr(module, switch, fused)
        patch.setattr(module, second_launch, lambda *a: launches.append(1) or launch(*a))
        out = call()
    return out, len(launches)


def assert_counters_zero(device: torch.device) -> None:
    from xinfer.kernels import arrivals

    assert not arrivals._by_lane[device, arrivals.MAIN].any(), "a counter was not set back to 0"


def assert_launches_repeat(run, call, times: int = 50) -> None:
    """`times` fused launches in a row, each bit-equal to the two-launch output (a missed
    memory ordering shows as a stale part now and then)."""
    apart, launches = run(call, fused=False)
    assert launches == 1, "the call must take the two-launch path with the tail off"
    outs = []
    for _ in range(times):
        out, launches = run(call, fused=True)
        assert launches == 0
        outs.append(out)
    torch.cuda.synchronize()
    for i, out in enumerate(outs):
        assert torch.equal(out, apart), f"launch {i}: {(out != apart).sum().item()} values differ"
    assert_counters_zero(apart.device)


def assert_graph_replays(run, call, times: int = 20) -> None:
    """The fused launch captured in a CUDA graph replays to the two-launch output."""
    apart, _ = run(call, fused=False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compiles, and makes the counters, outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for _ in range(times):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, apart)
    assert_counters_zero(apart.device)
