"""Timing helpers shared by the benchmarks: mean seconds per call between CUDA events, and
the device-to-device copy bandwidth that every floor in `docs/benchmarks.md` divides by."""

from __future__ import annotations

import torch


def cuda_seconds(fn, iters: int, warmup: bool = True) -> float:
    """Mean seconds per call of `fn` (GPU time between two events; one warm-up call first)."""
    if warmup:
        fn()
        torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def cuda_graph_seconds(fn, iters: int, calls_per_graph: int = 20) -> float:
    """Mean seconds per call of `fn` replayed from a CUDA graph of `calls_per_graph` calls
    (no Python launch cost: what decode, which runs in graphs, sees). `fn` must be
    capturable (no host sync); it runs twice eagerly first (compiles, caches)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    reps = max(1, iters // calls_per_graph)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / (reps * calls_per_graph)


def calls_graph_seconds(calls: list, iters: int) -> float:
    """Mean seconds per call when `calls` (distinct, capturable: e.g. one a layer's cache, so
    L2 does not serve the next) are replayed back to back in one CUDA graph; each runs once
    eagerly first (compiles)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    return cuda_seconds(graph.replay, iters) / len(calls)


def device_copy_bandwidth(device: torch.device | str = "cuda", gib: float = 1.0) -> float:
    """Bytes read + written per second by a device-to-device copy of `gib` GiB."""
    a = torch.randn(int(gib * (1 << 30)) // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    return 2 * a.numel() * a.element_size() / cuda_seconds(lambda: b.copy_(a), 10)
