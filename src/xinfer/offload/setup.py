"""Turns MoE offload on for a built model: sizes the slots, moves every layer's expert set
into the host store, attaches an `OffloadExecutor` per MoE layer, and returns the
`OffloadManager` the engine, the CUDA-graph runner, the CLI and the server talk to."""

from __future__ import annotations

import logging

import torch
from tqdm.auto import tqdm

from xinfer import envs, kernels
from xinfer.config import EngineConfig, OffloadConfig
from xinfer.offload.executor import OffloadExecutor
from xinfer.offload.host_store import HostExpertStore
from xinfer.offload.sizing import LayerShape, device_budget_bytes, plan_slots
from xinfer.offload.slot_cache import SlotCache
from xinfer.offload.staging import StagingBuffer, staging_bytes_for
from xinfer.offload.stats import CallProfile, OffloadStats, format_summary

logger = logging.getLogger("xinfer")
GB = 1e9
_PROGRESS_MIN_BYTES = 2 << 30  # show a progress bar when pinning at least this much


class OffloadManager:
    """Owns the host store, the per-layer slot caches, the staging buffer and the stats."""

    def __init__(
        self,
        store: HostExpertStore,
        executors: list[OffloadExecutor],
        staging: StagingBuffer,
        stats: OffloadStats,
        config: OffloadConfig,
        device: torch.device,
    ) -> None:
        self.store, self.executors, self.staging = store, executors, staging
        self._stats, self.config, self.device = stats, config, device
        self.top_k = max((e.top_k for e in executors), default=0)

    @property
    def slots_per_layer(self) -> list[int]:
        return [e.cache.num_slots for e in self.executors]

    @property
    def min_slots(self) -> int:
        return min(self.slots_per_layer, default=0)

    def is_graph_safe(self, num_tokens: int) -> bool:
        """Whether a MoE call of `num_tokens` tokens can be captured in a CUDA graph: the
        decode path suffices (T*k <= slots of every layer) and it is the device-side one."""
        if self.config.is_profile:
            return False
        if self.device.type == "cuda" and not (
            kernels.has_triton() and not envs.XINFER_DISABLE_TRITON()
        ):
            return False  # the reference fill reads the miss count on the host
        return num_tokens * self.top_k <= self.min_slots

    def stats(self) -> dict:
        """Per-layer and total hit/miss/byte counters (see offload/stats.py for the keys)."""
        return self._stats.snapshot()

    def reset_stats(self) -> None:
        self._stats.reset()

    def format_summary(self, elapsed_s: float | None = None) -> str:
        """One log line: hit rate, GB moved and, with the elapsed time, GB/s."""
        return format_summary(self.stats(), elapsed_s)

    def close(self) -> None:
        """Unpin the host store: only at shutdown, when no executor will run again."""
        self.store.close()


def enable_offload(
    model: torch.nn.Module,
    engine_config: EngineConfig,
    offload: OffloadConfig,
    device: torch.device,
) -> OffloadManager:
    """Offload the routed experts of every FusedMoE in `model.moe_layers()` (their expert
    tensors are on the host). Call before the KV cache is sized: `auto` leaves exactly the
    reserve free for it."""
    device = torch.device(device)
    layers = model.moe_layers()
    shapes = []
    for layer in layers:
        first = next(iter(layer.expert_tensors.values()))
        row_bytes = sum(t[0].numel() * t.element_size() for t in layer.expert_tensors.values())
        shapes.append(LayerShape(first.shape[0], layer.top_k, row_bytes))
    staging_bytes = max((staging_bytes_for(la.expert_tensors) for la in layers), default=0)
    resident = sum(p.numel() * p.element_size() for p in model.parameters())
    resident += sum(b.numel() * b.element_size() for b in model.buffers())
    budget = device_budget_bytes(device, engine_config.gpu_memory_limit_gb, resident)
    num_slots = plan_slots(shapes, offload, budget, staging_bytes)

    store = HostExpertStore(device)
    stats = OffloadStats(len(layers), device)
    profile = CallProfile(device) if offload.is_profile else None
    stats.profile = profile
    staging = StagingBuffer(device, staging_bytes)
    total = sum(s.num_experts * s.expert_bytes for s in shapes)
    executors = []
    pin = "pinning experts" if store.is_pinned else "moving experts"
    for i, layer in enumerate(
        tqdm(layers, desc=pin, unit="layer", disable=total < _PROGRESS_MIN_BYTES, leave=False)
    ):
        host = store.add_layer(layer.expert_tensors)
        slots = min(num_slots, shapes[i].num_experts)
        cache = SlotCache(host, slots, device, stats.counters[i])
        executor = OffloadExecutor(
            cache, host, staging, layer.top_k, profile, store, layer.expert_weights
        )
        layer.attach_executor(executor)
        executors.append(executor)
        stats.expert_bytes.append(shapes[i].expert_bytes)
        stats.layer_bytes.append(store.layer_bytes(i))
        stats.slots.append(slots)
        stats.num_experts.append(shapes[i].num_experts)
    stats.pinned_bytes = store.nbytes if store.is_pinned else 0
    max_tokens = engine_config.scheduler.max_num_batched_tokens
    needs_staging = any(
        s < sh.num_experts and max_tokens * sh.top_k > s for s, sh in zip(stats.slots, shapes)
    )
    if needs_staging and device.type == "cuda":
        staging.allocate()  # now, so that the KV cache sized next leaves room for it
    stats.staging_bytes = staging_bytes if needs_staging else 0
    _log_summary(offload, shapes, stats, store)
    return OffloadManager(store, executors, staging, stats, offload, device)


def _log_summary(
    offload: OffloadConfig, shapes: list[LayerShape], stats: OffloadStats, store: HostExpertStore
) -> None:
    if not shapes:
        logger.info("MoE offload: the model has no MoE layers; nothing to offload")
        return
    how = "auto" if offload.is_auto else f"fraction {offload.fraction:g}"
    slots, experts = min(stats.slots), max(sh.num_experts for sh in shapes)
    logger.info(
        "MoE offload: %d of %d experts per layer on the %s (%s), %d MoE layers",
        slots,
        experts,
        "GPU" if store.is_pinned else "device",
        how,
        len(shapes),
    )
    if store.is_pinned:
        logger.info("MoE offload: %.2f GB of experts pinned in host RAM", store.nbytes / GB)
    else:
        logger.info("MoE offload: %.2f GB of experts in host RAM (not pinned)", store.nbytes / GB)
    slot_bytes = sum(s * sh.expert_bytes for s, sh in zip(stats.slots, shapes))
    logger.info(
        "MoE offload: %.2f GB of expert slots, %.2f GB staging buffer",
        slot_bytes / GB,
        stats.staging_bytes / GB,
    )
