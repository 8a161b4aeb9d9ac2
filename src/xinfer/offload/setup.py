"""Turns MoE offload on for a built model: sizes the slots, moves every layer's expert set
into the host store, attaches an `OffloadExecutor` per MoE layer, and returns the
`OffloadManager` the engine, the CUDA-graph runner, the CLI and the server talk to."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch
from tqdm.auto import tqdm

from xinfer import envs, kernels
from xinfer.config import EngineConfig, OffloadConfig
from xinfer.errors import UserError
from xinfer.layers.moe import FusedMoE
from xinfer.offload.copy_engine import BounceBuffers, LayerCopies
from xinfer.offload.executor import OffloadExecutor, ResidentExecutor
from xinfer.offload.graph_nodes import unavailable_reason
from xinfer.offload.host_store import HostExpertStore
from xinfer.offload.link_check import check_link
from xinfer.offload.packed import (
    PackedExperts,
    layer_plane_buffers,
    pack_layer,
    packable,
    stored_row_bytes,
)
from xinfer.offload.packed_staging import PackedStager
from xinfer.offload.sizing import (
    GIB,
    LayerShape,
    SlotPlan,
    auto_reserve_bytes,
    device_budget_bytes,
    device_bytes_for,
    plan_slots,
    unplanned_bytes,
)
from xinfer.offload.slot_pool import (
    MAX_STREAM_BUFFERS,
    SlotPool,
    build_slot_caches,
    set_signature,
)
from xinfer.offload.staging import LayerStreamer
from xinfer.offload.stats import CallProfile, OffloadStats, format_summary

logger = logging.getLogger("xinfer")
GB = 1e9
_PROGRESS_MIN_BYTES = 2 << 30  # show a progress bar when pinning at least this much


def keeps_every_expert(offload: OffloadConfig) -> bool:
    """Whether the plan is known before loading to give every layer all its experts
    (fraction 1.0): the engine then builds the experts on the device directly."""
    return offload.fraction == 1.0


class OffloadManager:
    """Owns the host store, the per-layer slot caches and their pools, the prompt pass's
    layer streamer and the stats. `executors` are the offloaded layers only;
    `num_resident_layers` layers hold every expert on the device and run resident."""

    def __init__(
        self,
        store: HostExpertStore,
        executors: list[OffloadExecutor],
        pools: list[SlotPool],
        stats: OffloadStats,
        config: OffloadConfig,
        device: torch.device,
        max_call_tokens: int,
        num_resident_layers: int = 0,
        packed_stager: PackedStager | None = None,
    ) -> None:
        self.store, self.executors, self.pools = store, executors, pools
        self._stats, self.config, self.device = stats, config, device
        self.num_resident_layers = num_resident_layers
        self.top_k = max((e.top_k for e in executors), default=0)
        self.max_call_tokens = max_call_tokens  # tokens of the widest MoE call the caches fit
        self.layer_streamer = LayerStreamer(device, packed_stager)
        self.prefetcher = None  # set by offload/prefetch_setup.py when prefetch is on
        # free GPU bytes the slot plan meant to leave (None off CUDA or without a budget)
        self.planned_free_bytes: int | None = None

    @property
    def slots_per_layer(self) -> list[int]:
        return [e.cache.num_slots for e in self.executors]

    @property
    def min_slots(self) -> int:
        return min(self.slots_per_layer, default=0)

    def is_graph_safe(self, num_tokens: int) -> bool:
        """Whether a MoE call of `num_tokens` tokens can be captured in a CUDA graph: it fits
        the slots plus overflow rows (no call the engine makes is wider) and the device-side
        lookup and fill run it (no host read)."""
        if not self.executors:
            return True  # every layer is resident: nothing decides anything on the host
        if self.config.is_profile:
            return False
        if self.device.type == "cuda" and not (
            kernels.has_triton() and not envs.XINFER_DISABLE_TRITON()
        ):
            return False  # the reference fill reads the miss count on the host
        return num_tokens <= self.max_call_tokens

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
    min_free_bytes: int = 0,
) -> OffloadManager:
    """Offload the routed experts of every FusedMoE in `model.moe_layers()` (their expert
    tensors are on the host). Call before the KV cache is sized: `auto` leaves the reserve
    free for it, or `min_free_bytes` (what one --max-model-len sequence needs) if more."""
    device = torch.device(device)
    layers = model.moe_layers()
    offload = stream_buffers_for(model, offload)
    shapes = []
    for layer in layers:
        first = next(iter(layer.expert_tensors.values()))
        row_bytes = sum(t[0].numel() * t.element_size() for t in layer.expert_tensors.values())
        shapes.append(LayerShape(first.shape[0], layer.top_k, row_bytes))
    budget = None
    if any(_is_on(layer, device) for layer in layers):  # built in place: all resident
        plan = SlotPlan(max((s.num_experts for s in shapes), default=0), MAX_STREAM_BUFFERS)
    else:
        resident = sum(p.numel() * p.element_size() for p in model.parameters())
        resident += sum(b.numel() * b.element_size() for b in model.buffers())
        budget = device_budget_bytes(device, engine_config.gpu_memory_limit_gb, resident)
        plan = plan_slots(shapes, offload, budget, min_free_bytes)
        reserve = auto_reserve_bytes(offload, min_free_bytes)
        if offload.is_auto and budget is not None and reserve > int(offload.reserve_gb * GIB):
            logger.info(
                "MoE offload: 'auto' keeps %.2f GB free, more than XINFER_MOE_OFFLOAD_"
                "RESERVE_GB=%g: one --max-model-len sequence's KV cache and the workspace "
                "need it",
                reserve / GIB,
                offload.reserve_gb,
            )

    store = HostExpertStore(device)
    stats = OffloadStats(len(layers), device, offload.policy)
    profile = CallProfile(device) if offload.is_profile else None
    stats.profile = profile
    slots = [min(plan.slots, sh.num_experts) for sh in shapes]
    offloaded = []  # indices of the layers whose experts do not all fit
    for i, (layer, shape) in enumerate(zip(layers, shapes)):
        stats.expert_bytes.append(shape.expert_bytes)
        stats.moved_expert_bytes.append(shape.expert_bytes)
        stats.slots.append(slots[i])
        stats.num_experts.append(shape.num_experts)
        stats.is_resident.append(slots[i] == shape.num_experts)
        if slots[i] == shape.num_experts:  # every expert fits: no host copy, no lookup
            tensors = {k: t.to(device) for k, t in layer.expert_tensors.items()}
            layer.attach_executor(ResidentExecutor(tensors, layer.expert_weights))
        else:
            offloaded.append(i)
    total = sum(shapes[i].num_experts * shapes[i].expert_bytes for i in offloaded)
    pin = "pinning experts" if store.is_pinned else "moving experts"
    if offload.compress:
        pin = "packing and " + pin
    hosts = list(
        tqdm(
            host_sets([layers[i] for i in offloaded], offload.compress, device, store),
            desc=pin,
            total=len(offloaded),
            unit="layer",
            disable=total < _PROGRESS_MIN_BYTES,
            leave=False,
        )
    )
    if offload.compress and device.type == "cuda":
        torch.cuda.empty_cache()  # the packing's temporaries: free for the slots and KV cache
    for i, host in zip(offloaded, hosts):  # what a miss moves over the link
        stats.moved_expert_bytes[i] = sum(stored_row_bytes(t) for t in host.values())
    num_packed = sum(isinstance(t, PackedExperts) for h in hosts for t in h.values())
    if offload.compress and total and not num_packed:
        logger.warning(
            "--moe-offload-compress has no effect here: it packs bf16 expert tensors (rows of "
            "a multiple of 8 elements), and none of this model's offloaded experts (%s) packs",
            ", ".join(
                sorted({str(t.dtype).removeprefix("torch.") for h in hosts for t in h.values()})
            ),
        )
    elif (
        not offload.compress
        and "copy-engine" not in (offload.fill, offload.prefetch_fill)
        and _packs_any(hosts)
    ):
        logger.info(
            "MoE offload: the offloaded bf16 experts cross the link as stored; "
            "--moe-offload-compress keeps them packed, losslessly (3/4 of the bytes a miss, "
            "+15-31%% decode tok/s measured on an H100, ~0.5 s of start-up a GB)"
        )
    elif offload.compress and total:
        logger.info(
            "MoE offload: %d of %d expert tensors packed: %.2f GB in host RAM for %.2f GB of "
            "experts (%.1f%%)",
            num_packed,
            sum(len(h) for h in hosts),
            store.nbytes / GB,
            total / GB,
            100 * store.nbytes / total,
        )
    # The widest MoE call: a step's token budget, or a decode graph of max_num_seqs rows.
    sched = engine_config.scheduler
    max_call_tokens = max(sched.max_num_batched_tokens, sched.max_num_seqs)
    top_k = max((sh.top_k for sh in shapes), default=1)
    build = functools.partial(
        _attach_slots, layers, offloaded, hosts, stats, offload, device, max_call_tokens * top_k,
        profile, store,
    )  # fmt: skip
    built = build(plan)
    if built.executors:
        stats.link = check_link(built.executors[0], device)
    if offload.is_auto and budget is not None and len(offloaded) == len(layers):
        reserve = auto_reserve_bytes(offload, min_free_bytes)
        limit = engine_config.gpu_memory_limit_gb
        short = unplanned_bytes(device, limit, budget, shapes, plan, offload.compress, reserve)
        fewer = plan_slots(shapes, offload, budget - short, min_free_bytes) if short else plan
        if fewer.slots < plan.slots:
            logger.info(
                "MoE offload: start-up took %.2f GB of GPU memory more than the slot plan "
                "counts; %d slots a layer instead of %d keep what 'auto' leaves free",
                short / GIB,
                fewer.slots,
                plan.slots,
            )
            plan, budget = fewer, budget - short
            built = None  # the old pools go before the new ones are made
            for i in offloaded:
                layers[i].executor = None
            built = build(plan)
    _log_summary(offload, shapes, stats, store)
    num_resident = len(layers) - len(built.executors)
    manager = OffloadManager(
        store, built.executors, built.pools, stats, offload, device, max_call_tokens,
        num_resident, built.stager,
    )  # fmt: skip
    if budget is not None and device.type == "cuda":  # what the slot plan meant to leave free
        used = device_bytes_for(shapes, plan.slots, offload.compress, plan.stream_buffers)
        manager.planned_free_bytes = budget - used
    return manager


@dataclasses.dataclass
class _Slots:
    caches: list
    pools: list
    executors: list
    stager: PackedStager | None


def _attach_slots(
    layers, offloaded, hosts, stats, offload, device, max_call_ids, profile, store, plan
) -> _Slots:
    """The device rows of `plan`'s slots for the offloaded layers
    (`slot_pool.build_slot_caches`), their executors attached to the layers, and the prompt
    pass's packed stager: everything the slot plan counts, allocated before the KV cache is
    sized."""
    slots = [min(plan.slots, e) for e in stats.num_experts]
    for i in offloaded:  # (every other layer holds all its experts)
        stats.slots[i] = slots[i]
    caches, pools = build_slot_caches(
        hosts,
        [slots[i] for i in offloaded],
        device,
        [stats.counters[i] for i in offloaded],  # each layer's row (a view) of the stats
        max_call_ids,
        offload.policy,
        plan.stream_buffers,
    )
    executors = []
    bounce = _copy_engine_buffers(offload, device)  # checked even when nothing is offloaded
    for i, host, cache in zip(offloaded, hosts, caches):
        layer = layers[i]
        executor = OffloadExecutor(cache, host, layer.top_k, profile, store, layer.expert_weights)
        if bounce is not None:
            executor.copies = LayerCopies(cache, host, bounce)
        layer.attach_executor(executor)
        executors.append(executor)
    stager = _packed_stager(hosts, caches, device)
    stats.pinned_bytes = store.nbytes if store.is_pinned else 0
    regions = sum(p.region_nbytes for p in pools)
    stats.staging_buffer_bytes = regions + (stager.nbytes if stager else 0)
    stats.stream_buffers = plan.stream_buffers if pools else 0  # none: nothing streams
    return _Slots(caches, pools, executors, stager)


def streamed_together(model: torch.nn.Module) -> int:
    """The most MoE layers of one expert-set shape in one decoder layer of `model`'s layer
    stack (1 without a stack: no prompt pass). A prompt pass streams a decoder layer's MoE
    layers of one pool into one region each, all at once (offload/staging.py)."""
    make = getattr(model, "layer_stack", None)
    stack = make() if make is not None else None
    most = 1
    for layer in stack.layers if stack is not None else ():
        shapes = Counter(
            set_signature(m.expert_tensors) for m in layer.modules() if isinstance(m, FusedMoE)
        )
        most = max(most, *shapes.values()) if shapes else most
    return most


def stream_buffers_for(model: torch.nn.Module, offload: OffloadConfig) -> OffloadConfig:
    """`offload` with two stream buffers forced where a decoder layer streams two MoE layers
    of one shape together (no model we load has such a layer); refused where that needs
    more than the buffers there can be, or one was asked for."""
    need = streamed_together(model)
    if need < 2:
        return offload
    if need > MAX_STREAM_BUFFERS or offload.stream_buffers == 1:
        fix = (
            "use --moe-offload-stream-buffers 2 (or auto)"
            if need <= MAX_STREAM_BUFFERS
            else f"xinfer streams at most {MAX_STREAM_BUFFERS}: run this model without offload"
        )
        raise UserError(
            f"a decoder layer of this model holds {need} MoE layers of one shape, which a long "
            f"prompt streams together into {need} buffers; {fix}"
        )
    if offload.stream_buffers is None:
        logger.info(
            "MoE offload: two prompt-pass stream buffers: a decoder layer of this model holds "
            "two MoE layers of one shape"
        )
    return dataclasses.replace(offload, stream_buffers=MAX_STREAM_BUFFERS)


def _packed_stager(hosts: list[dict], caches: list, device: torch.device) -> PackedStager | None:
    """The prompt pass's buffer for packed experts (offload/packed_staging.py), sized for the
    packed tensors of the layers it may stream; None when there are none."""
    packed = [
        t
        for host, cache in zip(hosts, caches)
        if cache.stream_bases
        for t in host.values()
        if isinstance(t, PackedExperts)
    ]
    return PackedStager(packed, device) if packed else None


def _packs_any(hosts: list[dict]) -> bool:
    """Whether any offloaded expert tensor has the layout `--moe-offload-compress` packs."""
    return any(isinstance(t, torch.Tensor) and packable(t) for h in hosts for t in h.values())


def host_sets(
    layers: list[torch.nn.Module], compress: bool, device: torch.device, store: HostExpertStore
) -> Iterator[dict]:
    """Hand each layer's expert set to the host store, in order; yields the stored sets.
    With `compress`, the next layer's plane buffers are made on a helper thread while this
    layer packs: making them is mostly the first touch of fresh pages (xinfer/host_memory.py;
    ~0.27 s of a packed layer's ~0.75 on an H100 host, 2026-12-06), which needs neither the
    GPU nor the store. Peak host memory: one layer's planes more."""
    if not compress:
        for layer in layers:
            yield store.add_layer(_host_set(layer, store))
        return
    with ThreadPoolExecutor(1, thread_name_prefix="xinfer-planes") as pool:
        ahead = pool.submit(layer_plane_buffers, layers[0].expert_tensors) if layers else None
        for k, layer in enumerate(layers):
            buffers = ahead.result()
            if k + 1 < len(layers):
                ahead = pool.submit(layer_plane_buffers, layers[k + 1].expert_tensors)
            yield store.add_layer(_host_set(layer, store, device, buffers))


def _host_set(
    layer: torch.nn.Module,
    store: HostExpertStore,
    device: torch.device | None = None,
    buffers: dict | None = None,
) -> dict:
    """The expert set a layer hands the host store: its tensors, or with plane `buffers`
    (packing: `layer_plane_buffers`) their packings where a tensor packs (offload/packed.py,
    computed on `device`); the unpacked copies are dropped at once, so that packing peaks at
    about one layer above the packed size. On CUDA the unpacked tensors are pinned while
    they are read and the planes are pinned by the store before they are filled: the
    packing's copies both ways run at DMA speed."""
    tensors = layer.expert_tensors
    if buffers is None:
        return tensors
    layer.expert_tensors = {}
    with store.pinned_for_copies(tensors.values()):
        return pack_layer(tensors, device, store if store.is_pinned else None, buffers)


def check_fill(offload: OffloadConfig, device: torch.device) -> None:
    """Refuse `--moe-offload-fill copy-engine` (or `--moe-prefetch-fill copy-engine`), with
    the reason, where the driver or NVRTC cannot build its graph nodes (the engine asks
    before it reads any weight)."""
    for option, value in (("offload", offload.fill), ("prefetch", offload.prefetch_fill)):
        if value != "copy-engine":
            continue
        reason = "it needs an NVIDIA GPU" if device.type != "cuda" else unavailable_reason()
        if reason is not None:
            raise UserError(
                f"--moe-{option}-fill copy-engine cannot run here: {reason}; use "
                f"--moe-{option}-fill kernel"
            )


def _copy_engine_buffers(offload: OffloadConfig, device: torch.device) -> BounceBuffers | None:
    """`--moe-offload-fill copy-engine`: the device's bounce buffers (None for `kernel`)."""
    if offload.fill != "copy-engine":
        return None
    check_fill(offload, device)
    logger.info("MoE offload: decode graphs copy missed experts on the copy engine")
    return BounceBuffers(device)


def _is_on(layer: torch.nn.Module, device: torch.device) -> bool:
    """The layer's experts were built on `device` itself (not on the host)."""
    first = next(iter(layer.expert_tensors.values()))
    return first.device.type == device.type and device.type != "cpu"


def _log_summary(
    offload: OffloadConfig, shapes: list[LayerShape], stats: OffloadStats, store: HostExpertStore
) -> None:
    if not shapes:
        logger.info("MoE offload: the model has no MoE layers; nothing to offload")
        return
    how = "auto" if offload.is_auto else f"fraction {offload.fraction:g}"
    how += f", {offload.policy.upper()}"
    slots, experts = min(stats.slots), max(sh.num_experts for sh in shapes)
    logger.info(
        "MoE offload: %d of %d experts per layer on the %s (%s), %d MoE layers",
        slots,
        experts,
        "GPU" if store.is_pinned or all(stats.is_resident) else "device",
        how,
        len(shapes),
    )
    num_resident = sum(stats.is_resident)
    if num_resident:
        logger.info(
            "MoE offload: %d of %d MoE layers keep every expert on the device (resident: no "
            "host copy, no lookup)",
            num_resident,
            len(shapes),
        )
    if num_resident == len(shapes):
        if offload.stream_buffers is not None:
            logger.info(
                "MoE offload: --moe-offload-stream-buffers %d has no effect: every layer keeps "
                "all its experts on the device, nothing streams",
                offload.stream_buffers,
            )
        return
    if store.is_pinned:
        logger.info("MoE offload: %.2f GB of experts pinned in host RAM", store.nbytes / GB)
    else:
        logger.info("MoE offload: %.2f GB of experts in host RAM (not pinned)", store.nbytes / GB)
    slot_bytes = sum(
        s * sh.expert_bytes
        for s, sh, resident in zip(stats.slots, shapes, stats.is_resident)
        if not resident
    )
    logger.info(
        "MoE offload: %.2f GB of expert slots, %.2f GB of overflow / streaming rows (%s)",
        slot_bytes / GB,
        stats.staging_buffer_bytes / GB,
        "one prompt-pass stream buffer"
        if stats.stream_buffers == 1
        else f"{stats.stream_buffers} prompt-pass stream buffers",
    )
