"""Whole-layer expert streaming for a prompt pass (runner/prompt_pass.py runs a long prompt
layer by layer across all its chunks, so each layer's experts cross PCIe once per prompt).

For each offloaded MoE layer of the pass, in order, the experts that are not in the layer's
slots are copied from pinned host memory into one of the pool's staging regions (its R
stream buffers, slot_pool.py) by the copy engine (packed tensors: their planes through a
small device buffer, then unpacked from it: offload/packed_staging.py) on a side stream.
With two regions the copy overlaps the previous layer's compute on the main stream (double
buffering: the pool's i-th layer uses region i mod 2); with one, a layer's copy starts when
the previous layer of its pool has finished reading the region (its `exit`), so copies and
compute take turns. Experts already in slots are used in place. The executor then runs the
unchanged MoE kernel on its slot view with every expert id mapped to its row (slot or region
row). The slot tables are not touched."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
from torch import nn

from xinfer.offload.executor import OffloadExecutor
from xinfer.offload.packed import PackedExperts
from xinfer.offload.slot_cache import STAGING_COPIES, STREAMED

if TYPE_CHECKING:
    from xinfer.offload.packed_staging import PackedStager


def executors_of(module: nn.Module) -> list[OffloadExecutor]:
    """The offload executors of the MoE layers inside `module`, in module order."""
    found = []
    for m in module.modules():
        executor = getattr(m, "executor", None)
        if isinstance(executor, OffloadExecutor) and executor.cache.stream_bases:
            found.append(executor)
    return found


def copy_runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(expert, row) pairs → (first expert, first row, count) of runs where both step by 1:
    one copy each."""
    runs: list[tuple[int, int, int]] = []
    for e, r in pairs:
        if runs and runs[-1][0] + runs[-1][2] == e and runs[-1][1] + runs[-1][2] == r:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((e, r, 1))
    return runs


class LayerStreamer:
    """The offload side of a prompt pass: `begin(layers)` for a slice of decoder layers,
    then `enter(i)` / `exit(i)` around the computation of the slice's i-th layer, `end()`."""

    def __init__(self, device: torch.device, packed: PackedStager | None = None) -> None:
        self.device = device
        self.packed = packed  # stages packed tensors (None: the model has none)
        self.is_cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device) if self.is_cuda else None
        self._reset()

    def _reset(self) -> None:
        self.plan: list[range] = []  # per decoder layer of the slice: its executor indices
        self.executors: list[OffloadExecutor] = []
        self.regions: list[tuple[int, int]] = []  # per executor: (pool, region)
        self.missing: list[list[tuple[int, int]]] = []  # per executor: (expert, row) to copy
        self.rows: list[torch.Tensor] = []  # per executor: (E,) int32 row of every expert
        self.copied: dict[int, torch.cuda.Event | None] = {}  # started copies
        self.last_user: dict[tuple[int, int], int] = {}  # region → executor copied into it
        self.free: dict[tuple[int, int], torch.cuda.Event | None] = {}  # region → reads done

    def begin(self, layers: Sequence[nn.Module]) -> None:
        """Plan the slice: one read of the slot tables (the pass is eager), then start
        copying the first layer's experts."""
        self._reset()
        for layer in layers:
            found = executors_of(layer)
            self.plan.append(range(len(self.executors), len(self.executors) + len(found)))
            self.executors += found
        if not self.executors:
            return
        held = torch.cat([x.cache.expert_of_slot for x in self.executors]).tolist()
        offset, uses, rows = 0, {}, []
        for x in self.executors:
            cache = x.cache
            table = held[offset : offset + cache.num_slots]
            slot_of = {e: s for s, e in enumerate(table) if e >= 0}
            offset += cache.num_slots
            pool = next(iter(cache.slots.values())).untyped_storage().data_ptr()
            region = uses.get(pool, 0) % len(cache.stream_bases)  # alternate per pool
            uses[pool] = uses.get(pool, 0) + 1
            self.regions.append((pool, region))
            # Rows for the experts not in slots: the region's E - S rows, then the layer's
            # empty slots (still empty after the pass: the tables are not touched).
            base = cache.stream_bases[region]
            free = [base + j for j in range(cache.num_experts - cache.num_slots)]
            free += [s for s, e in enumerate(table) if e < 0]
            missing = [e for e in range(cache.num_experts) if e not in slot_of]
            pairs = list(zip(missing, free))
            to_row = dict(pairs) | slot_of
            rows.append([to_row[e] for e in range(cache.num_experts)])
            self.missing.append(pairs)
        width = max(len(r) for r in rows)
        table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32)
        table = table.to(self.device)
        self.rows = [table[i, : x.cache.num_experts] for i, x in enumerate(self.executors)]
        if self.is_cuda:
            self.side.wait_stream(torch.cuda.current_stream(self.device))  # earlier readers
        self._prefetch(0)

    def _prefetch(self, index: int) -> bool:
        """Start copying executor `index`'s missing experts into its region (side stream),
        unless done already or the region's previous user is still computing."""
        if index >= len(self.executors) or index in self.copied:
            return index < len(self.executors)
        key = self.regions[index]
        if key in self.last_user and key not in self.free:
            return False  # retried when that user exits
        x = self.executors[index]
        with torch.cuda.stream(self.side) if self.is_cuda else nullcontext():
            done = self.free.pop(key, None)
            if done is not None:
                self.side.wait_event(done)
            for name, host in x.host_tensors.items():
                dst = x.cache.slots[name]
                if isinstance(host, PackedExperts):
                    self.packed.stage(host, dst, self.missing[index])
                    continue
                for e, r, n in copy_runs(self.missing[index]):
                    dst[r : r + n].copy_(host[e : e + n], non_blocking=True)
            event = torch.cuda.Event() if self.is_cuda else None
            if event is not None:
                event.record(self.side)
        self.copied[index], self.last_user[key] = event, index
        x.cache.counters[STAGING_COPIES] += 1
        x.cache.counters[STREAMED] += len(self.missing[index])
        return True

    def enter(self, layer: int) -> None:
        """Before the slice's `layer` computes: make sure its copies are queued, queue the
        next layer's, wait for this one's, and point its executors at the streamed rows."""
        main = torch.cuda.current_stream(self.device) if self.is_cuda else None
        for i in self.plan[layer]:
            if not self._prefetch(i):
                raise RuntimeError(
                    "a decoder layer holds more offloaded MoE layers of one shape than the "
                    f"pool has streaming regions ({len(self.executors[i].cache.stream_bases)}; "
                    "--moe-offload-stream-buffers 2 gives two)"
                )
        self._prefetch(self.plan[layer].stop)  # the next MoE layer's copy overlaps this one
        for i in self.plan[layer]:
            if self.copied[i] is not None:
                main.wait_event(self.copied[i])
            x = self.executors[i]
            x.streamed = (self.rows[i], x.cache.slots)

    def exit(self, layer: int) -> None:
        """After `layer`'s last chunk: its regions may be overwritten once the reads finish;
        a copy that waited for one of them starts now."""
        for i in self.plan[layer]:
            self.executors[i].streamed = None
            event = None
            if self.is_cuda:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(self.device))
            self.free[self.regions[i]] = event
        self._prefetch(self.plan[layer].stop)

    def end(self) -> None:
        """The slice is over: later work on the main stream (decode lookups use region 0)
        is ordered after every copy."""
        for x in self.executors:
            x.streamed = None
        if self.is_cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.side)
        self._reset()
