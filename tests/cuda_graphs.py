"""CUDA graph capture for the GPU tests of launch-time switches (`test_pdl_gpu.py`)."""

from __future__ import annotations

import torch


def capture_after_warmup(call):
    """`call()` captured in a CUDA graph after one call on a side stream (it compiles, and
    makes the arrival counters, outside the capture): (the graph, the captured outputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = call()
    return graph, outs
