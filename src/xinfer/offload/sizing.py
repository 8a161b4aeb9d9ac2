"""How many GPU slots each MoE layer gets: a fixed fraction of its experts (rounded up, at
least top-k), or `auto`: every layer grown evenly into the free device memory while the
reserve (for the KV cache and workspaces, sized by the engine afterwards) stays free."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from xinfer.config import OffloadConfig
from xinfer.engine.memory import usable_gpu_bytes
from xinfer.errors import UserError
from xinfer.offload.packed_staging import STAGING_CHUNK

GIB = 1 << 30


@dataclass(frozen=True)
class LayerShape:
    """What sizing needs to know of one MoE layer."""

    num_experts: int
    top_k: int
    expert_bytes: int  # one expert, all of its tensors


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


def device_bytes_for(layers: list[LayerShape], slots: int, compress: bool = False) -> int:
    """GPU bytes of `slots` slots in every layer plus, below E, the two shared regions of
    E - S rows (call overflow and the prompt pass's second streaming buffer; slot_pool.py)
    and, with `compress`, the prompt pass's buffer of packed experts (packed_staging.py:
    STAGING_CHUNK rows of the widest packed tensor, bounded here by a whole expert)."""
    per_slot = sum(s.expert_bytes for s in layers)
    streamed = [s for s in layers if s.num_experts > slots]
    regions = [(s.num_experts - slots) * s.expert_bytes for s in streamed]
    packed = STAGING_CHUNK * max((s.expert_bytes for s in streamed), default=0)
    return slots * per_slot + 2 * max(regions, default=0) + (packed if compress else 0)


def plan_slots(
    layers: list[LayerShape],
    offload: OffloadConfig,
    budget_bytes: int | None,
    min_free_bytes: int = 0,
) -> int:
    """Slots per layer (the same for every layer). `budget_bytes` is the free device memory
    (None = unbounded). `auto` keeps `auto_reserve_bytes` free."""
    if not layers:
        return 0
    num_experts = min(s.num_experts for s in layers)
    top_k = max(s.top_k for s in layers)
    if offload.fraction is not None:
        slots = slots_for_fraction(offload.fraction, num_experts, top_k)
        need = device_bytes_for(layers, slots, offload.compress)
        if budget_bytes is not None and need > budget_bytes:
            raise UserError(
                f"MoE offload {offload.fraction} needs {need / GIB:.2f} GB of GPU memory "
                f"for expert slots but only {budget_bytes / GIB:.2f} GB is free; lower "
                "XINFER_MOE_OFFLOAD or use XINFER_MOE_OFFLOAD=auto"
            )
        return slots
    if not offload.is_auto:
        raise ValueError("plan_slots: offload is not enabled")
    if budget_bytes is None:
        return num_experts
    reserve = auto_reserve_bytes(offload, min_free_bytes)
    free = budget_bytes - reserve
    if device_bytes_for(layers, num_experts, offload.compress) <= free:
        return num_experts  # everything fits: no overflow regions needed either
    # The most slots that fit with their regions (few candidates: E is at most a few hundred).
    for slots in range(num_experts - 1, top_k - 1, -1):
        if device_bytes_for(layers, slots, offload.compress) <= free:
            return slots
    raise UserError(
        f"MoE offload 'auto' cannot fit {top_k} experts per layer in "
        f"{budget_bytes / GIB:.2f} GB of free GPU memory while keeping {reserve / GIB:.2f} GB "
        f"free ({_reserve_reason(offload, min_free_bytes)}); lower the reserve "
        "or --max-model-len, or use a smaller model"
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
