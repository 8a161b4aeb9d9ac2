"""How fast this host's experts reach the GPU, measured once at start-up: the fill kernel
copying ~64 MB of the first offloaded layer's experts from the host store into its slots (the
decode path's copy, from the store's memory as it was allocated), beside the copy engine
moving a block of `cudaHostAlloc` memory (the link's rate).

Why: on some H100 hosts the fill kernel read the store at 27-34 GB/s where the copy engine
moved 53-55, and every offload row ran 20-35% slower than on a healthy host (~50 against
~55; bench/NOTES.md, eighteenth, twenty-second and twenty-fourth sessions). A user cannot
tell that from tokens per second alone, so the engine says it: one log line with both rates,
a warning below SLOW_SHARE of the link, and both in `offload_stats()`
(`host_read_gbps`, `link_gbps`).

The fill writes into slots that no table points to yet (the caches are empty at start-up),
so nothing the engine reads changes; its kernel is the one decode compiles anyway. CUDA
only, and only where the timed copy is large enough to time the link (not a tiny model's
experts). Predicted cost, not yet timed: ~10 ms (four copies of up to 64 MB each way at
~50 GB/s) plus that compile."""

from __future__ import annotations

import logging

import torch

from xinfer.offload import kernels as offload_kernels

logger = logging.getLogger("xinfer")

SLOW_SHARE = 0.8  # the bench's SLOW HOST line uses the same rule (offload_bench/bandwidth.py)
# The timed fill copies experts until TIMED_BYTES (as many as the layer's slots allow); below
# MIN_TIMED_BYTES (a small model's experts) a copy times its latency, not the link, and
# nothing is measured or said.
TIMED_BYTES = 64 << 20
MIN_TIMED_BYTES = 16 << 20
LINK_BLOCK_BYTES = 64 << 20
REPEATS = 3


def is_slow_host(host_read_gbps: float | None, link_gbps: float | None) -> bool:
    """The fill kernel read the store below SLOW_SHARE of the link's rate (both measured)."""
    return bool(host_read_gbps and link_gbps) and host_read_gbps < SLOW_SHARE * link_gbps


def slow_host_warning(host_read_gbps: float, link_gbps: float) -> str | None:
    """The warning for a slow host (`is_slow_host`), else None."""
    if not is_slow_host(host_read_gbps, link_gbps):
        return None
    return (
        f"MoE offload: the GPU reads the experts in host memory at {host_read_gbps:.1f} GB/s, "
        f"{host_read_gbps / link_gbps:.2f} of the {link_gbps:.1f} GB/s the link moves from "
        "cudaHostAlloc memory; offload will run slower than on a host that reads at the "
        "link's rate (see docs/moe_offload.md, slow hosts)"
    )


def _seconds(fn, repeats: int = REPEATS) -> float:
    """The fastest of `repeats` timed calls of `fn` (after one untimed), in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def check_link(executor, device: torch.device) -> dict[str, float] | None:
    """Time the fill of `executor`'s first experts and a copy-engine block; log both (and
    the warning where it applies); → {"host_read_gbps", "link_gbps"}, or None off CUDA."""
    if device.type != "cuda":
        return None
    cache = executor.cache
    stored = sum(t[0].nbytes for t in _stored_rows(executor.host_tensors))
    count = min(-(-TIMED_BYTES // max(1, stored)), cache.num_slots, cache.num_experts)
    if count * stored < MIN_TIMED_BYTES:
        return None
    with torch.cuda.device(device):
        cache.miss_ids[:count].copy_(torch.arange(count, dtype=torch.int32))
        cache.miss_slots[:count].copy_(torch.arange(count, dtype=torch.int32))
        cache.miss_count.fill_(count)
        fill_s = _seconds(lambda: offload_kernels.fill(cache, executor.host_tensors))
        cache.miss_count.zero_()
        # into the layer's own slot rows too (its view runs on over later layers' slots; no
        # device memory of its own: the KV cache is sized next)
        slots = max(cache.slots.values(), key=lambda t: t[0].nbytes)[: cache.num_slots]
        slots = slots if slots.is_contiguous() else slots[0].contiguous()
        dst = slots.view(-1).view(torch.uint8)[:LINK_BLOCK_BYTES]
        src = torch.empty(dst.numel(), dtype=torch.uint8, pin_memory=True)
        link_s = _seconds(lambda: dst.copy_(src, non_blocking=True))
    rates = {"host_read_gbps": count * stored / fill_s / 1e9,
             "link_gbps": dst.numel() / link_s / 1e9}  # fmt: skip
    logger.info(
        "MoE offload: the decode fill read the host store at %.1f GB/s; the link moves %.1f",
        rates["host_read_gbps"],
        rates["link_gbps"],
    )
    if warning := slow_host_warning(rates["host_read_gbps"], rates["link_gbps"]):
        logger.warning(warning)
    return rates


def _stored_rows(host_tensors: dict) -> list[torch.Tensor]:
    """Each stored tensor (a packed one's planes) whose row 0 is one expert's bytes."""
    from xinfer.offload.packed import PackedExperts

    rows = []
    for t in host_tensors.values():
        rows.extend(t.planes.values() if isinstance(t, PackedExperts) else [t])
    return rows
