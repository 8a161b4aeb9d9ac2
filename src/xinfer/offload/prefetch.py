"""Cross-layer expert prefetch: while MoE layer l runs, the experts predicted for layer
l + d are copied from host memory into layer l + d's slots, so that the host→GPU link keeps
working while the GPU computes. On by default with offload, d = 2
(`config.DEFAULT_PREFETCH_DISTANCE`; offload/prefetch_setup.py installs it).

Per call of an offloaded layer l on the lookup path (OffloadExecutor → `before_lookup`, its
lookup and demand fill, then `after_fill`; with `issue_after_fill` steps 1-3 run in
`after_fill`, otherwise in `before_lookup` ahead of step 4):
1. if layer t = l + d is offloaded: the predictor gives t's expected experts from l's expert
   input (decode calls of at most `max_tokens` tokens; other calls predict nothing, but the
   reservation still runs to settle the last prediction's statistics);
2. `reserve` (offload/prefetch_table.py) takes slots of t, by its slot policy, for the
   predicted experts that are absent and writes t's prefetch miss list;
3. the prefetch fill (the unchanged zero-copy fill kernel on that list, or with
   `--moe-offload-fill copy-engine` the copy-engine fill of offload/copy_engine.py on its
   own bounce buffers); an event is recorded after it.
4. then layer l's own lookup waits for the event of l's prefetch (issued d layers ago), so
   that neither its fill (which may pick a slot a wrong prediction is still being written
   into) nor its GEMM (which reads the prefetched rows) can overtake the copy.
On CUDA, steps 2-3 run on a side stream that first waits for the main stream, so the main
stream goes on with l's GEMM (the reservation was ~4.5 µs a layer of the main stream's
path, 0.2 ms of a decode step: H100 trace, 2026-12-06). Step 1 runs there too when the
predictor allows it (`on_side_stream`: the router's GEMV and top-k read only l's expert
input and constant weights; its split-K GEMV counts arrivals in a lane of its own,
kernels/arrivals.py; the routing model's predictor reads state that t's routing advances on
the main stream, which waits for that read first, routing/predict.py). A reservation
touches only t's cache and table, which the main stream next reads at step 4.
All of it has fixed shapes and reads nothing on the host, so it is captured in the decode
CUDA graphs (the side stream forks from and joins the capture). On CPU there is one stream:
the fill runs at once, with the same decisions. Placement never changes the experts a token
uses nor their bits, so output is unchanged by prefetch (tested)."""

from __future__ import annotations

import logging

import torch

from xinfer.kernels import arrivals
from xinfer.offload import kernels as offload_kernels
from xinfer.offload.prefetch_table import PrefetchTable, reserve
from xinfer.runner.forward_context import ForwardContext, get_forward_context

logger = logging.getLogger("xinfer")
# The prefetch fill kernel's programs in all (`fill_programs`, --moe-prefetch-programs, sets
# another count). It shares the SMs with the layer it should hide behind, and its programs
# keep their SMs until the copy is done: at 2 per SM (264, the default until 2026-12-06) a
# trace on the H100 showed the MoE gate/up GEMV at 175 µs beside a prefetch fill against
# 20.5 µs alone, and prefetch made decode slower. bench/probe_prefetch_overlap.py on the H100
# (one layer's batch-1 compute beside a fill of GPTQ-sized experts, 2.43 MB): 16 programs
# moved 1-2 experts at 40-45 GB/s with the compute 1.01-1.11x slower (98% hidden); 132
# programs at 42-46 GB/s but the compute 1.44-1.93x slower.
PREFETCH_FILL_PROGRAMS = 16
# ... and with packed experts (--moe-offload-compress), whose fill unpacks as it copies and so
# keeps less in flight a program (~6 KB against up to 32 KB): at 16 programs packed prefetch
# lost (H100 with a slow host, Qwen3.5-35B-A3B shape, two ahead: 10% batch 1 0.88x, 20%
# 0.94x, batch 8 1.00x / 0.95x); at 64, on the same kind of host, it won (20% batch 1 1.10x
# and 1.11x in two calls, 10% 1.03x; batch 8 0.99x / 0.98x), and on a healthy host 1.12-1.18x
# at batch 1 and 0.99-1.02x at batch 8 (10%, 20%, auto). bench/NOTES.md, 2026-12-06.
PACKED_PREFETCH_FILL_PROGRAMS = 64


def default_fill_programs(packed: bool) -> int:
    """The prefetch fill kernel's programs when --moe-prefetch-programs is not given."""
    return PACKED_PREFETCH_FILL_PROGRAMS if packed else PREFETCH_FILL_PROGRAMS


PREFETCH_LANE = "prefetch"  # the side stream's arrival counters (kernels/arrivals.py)
# `issue_after_fill` (--moe-prefetch-issue): where layer l issues the prefetch of l + d.
# Before l's lookup (False), its copies compete with l's own demand fill for the link (and,
# on the copy engine, queue ahead of it), and l's GEMM waits for that demand fill: on the
# H200 that gave no gain (docs/benchmarks.md, 2026-12-04). After l's demand fill (True),
# they share the link with nothing and overlap l's GEMM and the next layer's attention.
# Decisions and output are the same either way (each layer's table and slots are its own).


class Prefetcher:
    """`executors[i]`: the OffloadExecutor of MoE layer i, or None where the layer runs
    resident; `tables[i]` likewise; `predictor(target, hidden, ctx) → (T, k) ids`."""

    def __init__(
        self,
        executors: list,
        tables: list[PrefetchTable | None],
        predictor,
        distance: int,
        max_tokens: int,
        device: torch.device,
        fill_programs: int = PREFETCH_FILL_PROGRAMS,
        issue_after_fill: bool = True,
    ) -> None:
        if distance < 1:
            raise ValueError(f"prefetch distance must be >= 1, got {distance}")
        self.executors, self.tables, self.predictor = executors, tables, predictor
        self.distance, self.max_tokens, self.device = distance, max_tokens, device
        self.is_cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device) if self.is_cuda else None
        self.events = [
            torch.cuda.Event() if self.is_cuda and t is not None else None for t in tables
        ]
        self.is_issued = [False] * len(tables)  # host: an event to wait for before the lookup
        self.issue_after_fill = issue_after_fill
        self.fill_programs = fill_programs if self.is_cuda else None
        # a (1, 1) "no prediction" for calls that only settle (no empty tensor to a kernel)
        self._nothing = torch.full((1, 1), -1, dtype=torch.int32, device=device)
        self.copies: list | None = None  # per layer: its copy-engine prefetch fill, if used
        self.predictor_on_side = self.is_cuda and getattr(predictor, "on_side_stream", False)
        if self.predictor_on_side:  # its arrival counters, made now: never inside a capture
            with arrivals.lane(PREFETCH_LANE):
                arrivals.counters(device, 0)

    def use_copy_engine(self) -> None:
        """Prefetch fills inside decode graphs go through the copy engine (bounce buffers of
        their own: the side stream's copies run beside the main stream's)."""
        from xinfer.offload.copy_engine import BounceBuffers, LayerCopies

        bounce = BounceBuffers(self.device)
        self.copies = [
            None if t is None else LayerCopies(t.fill_target(), x.host_tensors, bounce)
            for t, x in zip(self.tables, self.executors)
        ]

    def predicts(self, ctx: ForwardContext | None, num_tokens: int) -> bool:
        """Whether a call predicts: decode calls of at most `max_tokens` tokens."""
        return ctx is not None and ctx.is_decode and num_tokens <= self.max_tokens

    def before_lookup(self, layer: int, hidden: torch.Tensor) -> None:
        """Layer `layer`'s call with expert input `hidden` (T, H), before its lookup: issue
        the prefetch of layer + distance (unless `issue_after_fill`), then wait for this
        layer's own."""
        if not self.issue_after_fill:
            self._issue_ahead(layer, hidden)
        if self.is_issued[layer]:
            torch.cuda.current_stream(self.device).wait_event(self.events[layer])
            self.is_issued[layer] = False

    def after_fill(self, layer: int, hidden: torch.Tensor) -> None:
        """Layer `layer`'s call after its lookup and demand fill, before its GEMM: issue the
        prefetch of layer + distance (with `issue_after_fill`)."""
        if self.issue_after_fill:
            self._issue_ahead(layer, hidden)

    def _issue_ahead(self, layer: int, hidden: torch.Tensor) -> None:
        target = layer + self.distance
        if target < len(self.tables) and self.tables[target] is not None:
            self._issue(target, hidden)

    def _issue(self, target: int, hidden: torch.Tensor) -> None:
        table = self.tables[target]
        ctx = _context()
        if not self.predicts(ctx, hidden.shape[0]):
            reserve(table, self._nothing)  # settle only: nothing to copy
            return
        host = self.executors[target].host_tensors
        if not self.is_cuda:
            pred_ids = self.predictor(target, hidden, ctx)
            reserve(table, pred_ids)
            offload_kernels.fill(table.fill_target(), host)
            return
        # The reservation and the fill run on the side stream, off the main stream's path;
        # the predictor too where it may (the module docstring).
        main = torch.cuda.current_stream(self.device)
        if self.predictor_on_side:
            self.side.wait_stream(main)  # l's expert input (and all before it) first
            hidden.record_stream(self.side)  # the main stream may reuse its memory meanwhile
            with torch.cuda.stream(self.side), arrivals.lane(PREFETCH_LANE):
                pred_ids = self.predictor(target, hidden, ctx)
        else:
            pred_ids = self.predictor(target, hidden, ctx)
            self.side.wait_stream(main)  # the prediction (and all before it) first
            pred_ids.record_stream(self.side)  # the main stream may reuse its memory meanwhile
        with torch.cuda.stream(self.side):
            reserve(table, pred_ids)
            if self.copies is not None and torch.cuda.is_current_stream_capturing():
                self.copies[target].fill()
            else:
                offload_kernels.fill(table.fill_target(), host, num_programs=self.fill_programs)
            self.events[target].record(self.side)
        self.is_issued[target] = True

    def reset_stats(self) -> None:
        """Forget the pending prefetches with the counters (the caller zeroes those), so
        that a prefetch issued before a reset is never settled after it."""
        for table in self.tables:
            if table is not None:
                table.pending.fill_(-1)


def _context() -> ForwardContext | None:
    """The forward context, or None when a layer is called outside the model runner."""
    try:
        return get_forward_context()
    except RuntimeError:
        return None
