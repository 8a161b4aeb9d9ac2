"""How many GPU slots each MoE layer gets, and how many stream buffers the prompt pass gets
(offload/slot_pool.py regions): a fixed fraction of its experts (rounded up, at least
top-k), or `auto`: every layer grown evenly into the free device memory while the reserve
(for the KV cache and workspaces, sized by the engine afterwards) stays free.

The buffer count (`--moe-offload-stream-buffers`, `auto` unless forced to 1 or 2): each
buffer is E - S rows of every layer's shape, the price of a few slots a layer where the
budget is tight. Two let a long prompt's pass copy layer i+1 while layer i computes; one
gives its rows to the slots, and the pass copies and computes in turn. With `auto` slots,
`auto` takes one buffer where that buys at least STREAM_BUFFER_GAIN (1.2) times the slots
a layer, i.e. where the second buffer would cost at least a sixth of the slots. Why 1.2:
Qwen1.5-MoE-A2.7B bf16 at 12 GB (24 layers, 17.3 MB experts) gets 7 of 60 slots with two
buffers (2 × 53 × 17.3 MB = 1.83 GB of regions) and 9 with one, which a slot-policy
simulation puts at ~16% fewer missed expert bytes in a decode that is link-bound there, for
long prompts' first tokens up to ~30% later where they are copy-bound: one. Qwen3-30B-A3B
bf16 at 24 GB gets 38 of 128 with two and ~40 with one (5% more): two. A fixed fraction
keeps two buffers where they fit, else one (said at start-up)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from xinfer.config import OffloadConfig
from xinfer.engine.memory import usable_gpu_bytes
from xinfer.errors import UserError
from xinfer.offload.packed_staging import STAGING_CHUNK
from xinfer.offload.slot_pool import MAX_STREAM_BUFFERS

GIB = 1 << 30
STREAM_BUFFER_GAIN = 1.2  # `auto`: one buffer when it gives at least 1.2 × the slots of two
logger = logging.getLogger("xinfer")


@dataclass(frozen=True)
class LayerShape:
    """What sizing needs to know of one MoE layer."""

    num_experts: int
    top_k: int
    expert_bytes: int  # one expert, all of its tensors


@dataclass(frozen=True)
class SlotPlan:
    """Slots per layer (the same for every layer, at most its E) and the prompt pass's
    stream buffers of the pools (1 or 2; unused where every layer keeps all its experts)."""

    slots: int
    stream_buffers: int


def slots_for_fraction(fraction: float, num_experts: int, top_k: int) -> int:
    # The epsilon keeps e.g. 0.3 * 10 = 3.0000000000000004 from rounding up to 4.
    return min(num_experts, max(top_k, math.ceil(fraction * num_experts - 1e-9)))


def device_budget_bytes(
    device: torch.device, limit_gb: float | None, resident_bytes: int
) -> int | None:
    """Free bytes on `device` (as if it had `limit_gb` GB). On CPU only a given limit means
    anything (minus what the model already holds there); None = unbounded."""
    if device.type == "cuda":
        return usable_gpu_bytes(device, limit_gb)
    if limit_gb is None:
        return None
    return max(0, int(limit_gb * GIB) - resident_bytes)


def device_bytes_for(
    layers: list[LayerShape],
    slots: int,
    compress: bool = False,
    stream_buffers: int = MAX_STREAM_BUFFERS,
) -> int:
    """GPU bytes of `slots` slots in every layer plus, below E, the `stream_buffers` shared
    regions of E - S rows (region 0 is also the call overflow; slot_pool.py) and, with
    `compress`, the prompt pass's buffer of packed experts (packed_staging.py: STAGING_CHUNK
    rows of the widest packed tensor, bounded here by a whole expert)."""
    per_slot = sum(s.expert_bytes for s in layers)
    streamed = [s for s in layers if s.num_experts > slots]
    regions = [(s.num_experts - slots) * s.expert_bytes for s in streamed]
    packed = STAGING_CHUNK * max((s.expert_bytes for s in streamed), default=0)
    region_bytes = stream_buffers * max(regions, default=0)
    return slots * per_slot + region_bytes + (packed if compress else 0)


def plan_slots(
    layers: list[LayerShape],
    offload: OffloadConfig,
    budget_bytes: int | None,
    min_free_bytes: int = 0,
) -> SlotPlan:
    """Slots per layer and stream buffers (module docstring). `budget_bytes` is the free
    device memory (None = unbounded). `auto` keeps `auto_reserve_bytes` free."""
    forced = offload.stream_buffers
    if not layers:
        return SlotPlan(0, forced or MAX_STREAM_BUFFERS)
    num_experts = min(s.num_experts for s in layers)
    top_k = max(s.top_k for s in layers)
    if offload.fraction is not None:
        return _plan_fraction(layers, offload, budget_bytes, num_experts, top_k)
    if not offload.is_auto:
        raise ValueError("plan_slots: offload is not enabled")
    if budget_bytes is None:
        return SlotPlan(num_experts, forced or MAX_STREAM_BUFFERS)
    return _plan_auto(layers, offload, budget_bytes, min_free_bytes, num_experts, top_k)


def _plan_auto(
    layers: list[LayerShape],
    offload: OffloadConfig,
    budget_bytes: int,
    min_free_bytes: int,
    num_experts: int,
    top_k: int,
) -> SlotPlan:
    """`auto` slots: the most that fit with the forced buffer count, else with each count,
    and the count by `choose_stream_buffers`; refused where not even top-k fit."""
    forced = offload.stream_buffers
    reserve = auto_reserve_bytes(offload, min_free_bytes)
    free = budget_bytes - reserve
    # S = E (everything fits) needs no regions at all: the same slots with either count
    most = {
        n: _most_slots(layers, free, offload.compress, n, top_k, num_experts)
        for n in ([forced] if forced else [1, MAX_STREAM_BUFFERS])
    }
    buffers = forced or choose_stream_buffers(most[1], most[MAX_STREAM_BUFFERS])
    if most[buffers] is not None:
        return SlotPlan(most[buffers], buffers)
    hint = ""
    if forced == MAX_STREAM_BUFFERS and (
        _most_slots(layers, free, offload.compress, 1, top_k, num_experts) is not None
    ):
        hint = "; one stream buffer (--moe-offload-stream-buffers auto or 1) would fit"
    raise UserError(
        f"MoE offload 'auto' cannot fit {top_k} experts per layer in "
        f"{budget_bytes / GIB:.2f} GB of free GPU memory while keeping {reserve / GIB:.2f} GB "
        f"free ({_reserve_reason(offload, min_free_bytes)}); lower the reserve "
        f"or --max-model-len, or use a smaller model{hint}"
    )


def choose_stream_buffers(one: int | None, two: int | None) -> int:
    """`auto`'s buffer count from the most slots that fit with one and with two buffers
    (None: not even top-k): one where it gives at least STREAM_BUFFER_GAIN × the slots of
    two (module docstring), else two; said at start-up where they differ."""
    if one is not None and (two is None or one >= STREAM_BUFFER_GAIN * two - 1e-9):
        logger.info(
            "MoE offload: one prompt-pass stream buffer (%d slots a layer instead of %s; long "
            "prompts copy and compute in turn, without overlap; --moe-offload-stream-buffers "
            "2 keeps two)",
            one,
            "none" if two is None else two,
        )
        return 1
    if one is not None and one > two:
        logger.info(
            "MoE offload: two prompt-pass stream buffers (%d slots a layer; one would give %d, "
            "less than %g×; --moe-offload-stream-buffers 1 takes them)",
            two,
            one,
            STREAM_BUFFER_GAIN,
        )
    return MAX_STREAM_BUFFERS


def _most_slots(
    layers: list[LayerShape],
    free: int,
    compress: bool,
    buffers: int,
    top_k: int,
    num_experts: int,
) -> int | None:
    """The most slots up to E (at least top-k) that fit `free` bytes with `buffers` stream
    buffers; None if not even top-k do (few candidates: E is at most a few hundred)."""
    for slots in range(num_experts, top_k - 1, -1):
        if device_bytes_for(layers, slots, compress, buffers) <= free:
            return slots
    return None


def _plan_fraction(
    layers: list[LayerShape],
    offload: OffloadConfig,
    budget_bytes: int | None,
    num_experts: int,
    top_k: int,
) -> SlotPlan:
    """A fixed fraction: its slots, with the buffers forced, else two where they fit and
    one where only that fits; refused where the forced count, or neither, fits."""
    slots = slots_for_fraction(offload.fraction, num_experts, top_k)
    forced = offload.stream_buffers
    need = {
        n: device_bytes_for(layers, slots, offload.compress, n) for n in (1, MAX_STREAM_BUFFERS)
    }
    fits = {n: budget_bytes is None or need[n] <= budget_bytes for n in need}
    buffers = forced or (MAX_STREAM_BUFFERS if fits[MAX_STREAM_BUFFERS] else 1)
    if fits[buffers]:
        if buffers == 1 and not forced and need[1] < need[MAX_STREAM_BUFFERS]:
            logger.info(
                "MoE offload: one prompt-pass stream buffer: %d slots a layer fit %.2f GB of "
                "GPU memory with one (%.2f GB), not with two (%.2f GB); long prompts copy and "
                "compute in turn, without overlap",
                slots,
                budget_bytes / GIB,
                need[1] / GIB,
                need[MAX_STREAM_BUFFERS] / GIB,
            )
        return SlotPlan(slots, buffers)
    hint = ""
    if forced == MAX_STREAM_BUFFERS and fits[1]:
        hint = " (or --moe-offload-stream-buffers 1, which fits)"
    raise UserError(
        f"MoE offload {offload.fraction} needs {need[buffers] / GIB:.2f} GB of GPU memory "
        f"for expert slots but only {budget_bytes / GIB:.2f} GB is free; lower "
        f"XINFER_MOE_OFFLOAD{hint} or use XINFER_MOE_OFFLOAD=auto"
    )


def auto_reserve_bytes(offload: OffloadConfig, min_free_bytes: int = 0) -> int:
    """What `auto` leaves free: XINFER_MOE_OFFLOAD_RESERVE_GB, or more where the engine needs
    more to start (`min_free_bytes`: one --max-model-len sequence's KV cache, its recurrent
    state and the workspace; engine/memory.py `min_free_gpu_bytes`), so that `auto` never
    picks slots that leave the KV cache too small for one sequence."""
    return max(int(offload.reserve_gb * GIB), min_free_bytes)


def _reserve_reason(offload: OffloadConfig, min_free_bytes: int) -> str:
    if min_free_bytes > int(offload.reserve_gb * GIB):
        return (
            "what one --max-model-len sequence's KV cache and the workspace need, more than "
            f"XINFER_MOE_OFFLOAD_RESERVE_GB={offload.reserve_gb}"
        )
    return f"XINFER_MOE_OFFLOAD_RESERVE_GB={offload.reserve_gb}"


def unplanned_bytes(
    device: torch.device,
    limit_gb: float | None,
    budget_bytes: int,
    layers: list[LayerShape],
    plan: SlotPlan,
    compress: bool,
    reserve_bytes: int,
) -> int:
    """Measured after the slots are built: where the free device memory is below
    `reserve_bytes` (what `auto` keeps free), the bytes start-up took beyond what the plan
    counts (`device_bytes_for`), so that a plan for `budget_bytes` less that many keeps the
    reserve; 0 where the reserve holds, or off CUDA (nothing measured there). With
    `--isq q8_0` experts an H100 ended one sequence's KV cache short, and an H200 measured
    0.083-0.093 GiB beyond the plan (bench/NOTES.md, twenty-seventh session)."""
    if device.type != "cuda":
        return 0
    free = usable_gpu_bytes(device, limit_gb)
    if free >= reserve_bytes:
        return 0
    planned = budget_bytes - device_bytes_for(layers, plan.slots, compress, plan.stream_buffers)
    return max(planned, reserve_bytes) - free
