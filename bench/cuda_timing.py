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


def device_copy_bandwidth(device: torch.device | str = "cuda", gib: float = 1.0) -> float:
    """Bytes read + written per second by a device-to-device copy of `gib` GiB."""
    a = torch.randn(int(gib * (1 << 30)) // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    return 2 * a.numel() * a.element_size() / cuda_seconds(lambda: b.copy_(a), 10)
