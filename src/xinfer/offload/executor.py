"""Expert executors: the strategy that runs a MoE layer's routed experts. `ResidentExecutor`
keeps the full `[E, ...]` set where the model runs; `OffloadExecutor` keeps a slot cache over
a host store: lookup → fill → GEMM on the layer's slot view, whatever the call's width (misses
beyond the slots use the view's overflow rows), or, during a prompt pass, the layer streamed
by offload/staging.py. All call the same `kernels.fused_moe`, which never knows which one it
serves."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import torch

from xinfer import kernels
from xinfer.offload import kernels as offload_kernels
from xinfer.offload.slot_cache import SlotCache
from xinfer.offload.stats import CallProfile
from xinfer.quant.experts import ExpertWeights


class ExpertExecutor(ABC):
    @abstractmethod
    def __call__(
        self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        """hidden (T, H), topk_ids int32 (T, k) expert ids, topk_weights float32 (T, k)."""

    @property
    def takes_any_width(self) -> bool:
        """Whether a call may be wider than one engine step's tokens (a prompt pass joining
        its chunks' calls, runner/expert_merge.py)."""
        return True


def run_experts(
    hidden: torch.Tensor,
    ids: torch.Tensor,
    topk_weights: torch.Tensor,
    tensors: dict[str, torch.Tensor],
    weights: ExpertWeights | None = None,
    max_ids: int | None = None,
) -> torch.Tensor:
    """The unchanged MoE kernel on an expert set (`[E, ...]` or `[S, ...]` with slot ids), in
    the layer's weight format (`weights`; None: the plain {w13, w2} set). `max_ids`: the
    layer's experts E, given with a slot view: a call uses at most E of its rows, which
    bounds the work of kernels that would otherwise size it by the view's rows (the view
    holds later layers' slots and the shared regions: offload/slot_pool.py)."""
    if weights is not None:
        return weights(hidden, ids, topk_weights, tensors, max_ids)
    return kernels.fused_moe(hidden, ids, topk_weights, tensors["w13"], tensors["w2"])


class ResidentExecutor(ExpertExecutor):
    def __init__(
        self, tensors: dict[str, torch.Tensor], weights: ExpertWeights | None = None
    ) -> None:
        self.tensors, self.weights = tensors, weights

    def __call__(
        self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        return run_experts(hidden, topk_ids, topk_weights, self.tensors, self.weights)


class OffloadExecutor(ExpertExecutor):
    """One MoE layer's experts in a host store, `cache.num_slots` of them in device slots."""

    def __init__(
        self,
        cache: SlotCache,
        host_tensors: dict[str, torch.Tensor],
        top_k: int,
        profile: CallProfile | None = None,
        store: object | None = None,
        weights: ExpertWeights | None = None,
    ) -> None:
        self.cache, self.host_tensors, self.top_k = cache, host_tensors, top_k
        self.weights = weights  # the layer's format (None: plain {w13, w2})
        self.store = store  # the HostExpertStore: its pinning lives as long as we do
        self.profile = profile
        # Set by a prompt pass while it runs this layer: (row of each expert (E,) int32 on
        # the device, the view those rows address); None = the lookup path.
        self.streamed: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None
        # Set by offload/prefetch.py: (the Prefetcher, this layer's MoE index); None = off.
        self.prefetch: tuple[object, int] | None = None
        # Set by offload/setup.py for `--moe-offload-fill copy-engine`: the layer's
        # copy-engine fill (offload/copy_engine.py), used while a decode graph is captured.
        self.copies = None

    @property
    def takes_any_width(self) -> bool:
        """Only while a prompt pass streams the layer: the lookup path's overflow rows are
        sized for one step's tokens."""
        return self.streamed is not None

    @property
    def max_ids(self) -> int:
        """Distinct rows of the view one call can use: one per expert of the layer, whether
        they are slots, overflow rows or a prompt pass's streamed rows."""
        return self.cache.num_experts

    def load_experts(
        self, topk_ids: torch.Tensor, hidden: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict]:
        """Make this call's experts resident: (ids to use, expert set to run on). No host
        decision and no device read: fixed shapes, graph-safe for every call size. With
        prefetch, `hidden` (the call's expert input) predicts a later layer's experts."""
        if self.streamed is not None:
            rows, tensors = self.streamed
            return rows[topk_ids.long()], tensors
        prefetch = self.prefetch if hidden is not None else None
        if prefetch is not None:
            prefetch[0].before_lookup(prefetch[1], hidden)
        slot_ids = offload_kernels.lookup(self.cache, topk_ids)
        if self.copies is not None and torch.cuda.is_current_stream_capturing():
            self.copies.fill()  # the same bytes to the same rows, on the copy engine
        else:
            offload_kernels.fill(self.cache, self.host_tensors)
        if prefetch is not None:
            prefetch[0].after_fill(prefetch[1], hidden)
        return slot_ids, self.cache.slots

    def __call__(
        self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        if self.profile is not None:
            return self._profiled(hidden, topk_ids, topk_weights)
        ids, tensors = self.load_experts(topk_ids, hidden)
        return run_experts(hidden, ids, topk_weights, tensors, self.weights, self.max_ids)

    def _profiled(
        self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        p, clock = self.profile, time.perf_counter
        t_enter = clock()
        gap = 0.0 if p.last_exit is None else t_enter - p.last_exit
        p.sync()  # earlier work (attention, router) done
        t_copy = clock()
        ids, tensors = self.load_experts(topk_ids, hidden)
        p.sync()
        t_gemm = clock()
        out = run_experts(hidden, ids, topk_weights, tensors, self.weights, self.max_ids)
        t_launched = clock()
        p.sync()
        t_done = clock()
        p.add(
            launch_gap=gap,
            gpu_wait=(t_copy - t_enter) + (t_done - t_launched),
            host=t_launched - t_gemm,
            copy=t_gemm - t_copy,
        )
        return out
