"""CUDA graphs for decode-only steps: one graph per batch size (every size up to 16, then
steps of 8), captured once over static input buffers that each replay refills. Smaller
batches are padded to the next captured size with rows that write no KV and attend to
nothing. Sizes that a layer cannot run without a host decision are left eager.

The garbage collector is paused while a graph captures: a cycle collected then may run a
finalizer that calls the CUDA API (a dropped engine's host store unregistering its pinned
experts), which a capture forbids from any thread; the capture would fail with "operation
failed due to a previous error during capture" at whatever launch came next."""

from __future__ import annotations

import contextlib
import gc
import logging
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from xinfer.runner.forward_context import ForwardContext, forward_context

if TYPE_CHECKING:
    from xinfer.runner.model_runner import HostBatch, ModelRunner

logger = logging.getLogger("xinfer")


def capture_sizes(max_batch: int) -> list[int]:
    sizes = list(range(1, min(max_batch, 16) + 1))
    sizes += list(range(24, max_batch + 1, 8))
    if sizes[-1] < max_batch:
        sizes.append(max_batch)
    return sizes


@contextlib.contextmanager
def gc_paused():
    """No automatic garbage collection inside the block (restored as it was after)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class CudaGraphRunner:
    """Each graph runs the model and the LM head: a replay turns the static inputs into the
    float32 logits of every row. The inputs live in two packed device buffers, each
    refilled from pinned memory with one copy per step: int64 [input_ids | positions |
    slot_mapping | request_rows | request_keys] and int32 [seq_lens | state_ids |
    block_tables] (state_ids: hybrid models' recurrent-state slots; request rows and keys:
    runner/request_slots.py; padding rows -1, or the scratch row)."""

    def __init__(self, runner: ModelRunner) -> None:
        # the model and bounds, not the runner itself (which holds this object: no cycle)
        self.model, self.max_model_len = runner.model, runner.max_model_len
        self.scratch_row = runner.request_slots.scratch_row  # padding rows' state row
        self.has_state = bool(runner.state_caches)
        device = runner.device
        sizes = [b for b in capture_sizes(runner.max_num_seqs) if runner.is_graph_safe(b)]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        if not sizes:
            logger.info("CUDA graphs: no batch size can be captured; decode runs eagerly")
            return
        n, w = max(sizes), runner.max_blocks_per_seq
        self.max_rows, self.width = n, w
        # Two pinned buffer pairs, used in turn; an event says when a pair's copy is done.
        self.host = [
            (
                torch.zeros(5 * n, dtype=torch.int64, pin_memory=True),
                torch.zeros(2 * n + n * w, dtype=torch.int32, pin_memory=True),
            )
            for _ in range(2)
        ]
        self.copied: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0
        self.dev64 = torch.zeros(5 * n, dtype=torch.int64, device=device)
        self.dev32 = torch.zeros(2 * n + n * w, dtype=torch.int32, device=device)
        self.input_ids, self.positions = self.dev64[:n], self.dev64[n : 2 * n]
        self.slot_mapping = self.dev64[2 * n : 3 * n]
        self.request_rows, self.request_keys = self.dev64[3 * n : 4 * n], self.dev64[4 * n :]
        self.request_rows.fill_(self.scratch_row)  # captures run on padding-like rows
        self.request_keys.fill_(-1)
        self.seq_lens = self.dev32[:n]
        self.state_ids = self.dev32[n : 2 * n]
        self.state_ids.fill_(-1)  # captures (and padding rows) touch no request's state
        self.block_tables = self.dev32[2 * n :].view(n, w)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.pool = torch.cuda.graph_pool_handle()
        gc.collect()  # what is already garbage goes now, not in the middle of a capture
        for bs in tqdm(sorted(sizes, reverse=True), desc="Capturing CUDA graphs"):
            self._capture(bs)

    def _context(self, bs: int) -> ForwardContext:
        return ForwardContext(
            slot_mapping=self.slot_mapping[:bs],
            block_tables=self.block_tables[:bs],
            seq_lens=self.seq_lens[:bs],
            query_start_loc=self.query_start_loc[: bs + 1],
            max_query_len=1,
            max_seq_len=self.max_model_len,
            state_ids=self.state_ids[:bs] if self.has_state else None,
            request_rows=self.request_rows[:bs],
            request_keys=self.request_keys[:bs],
        )

    @torch.inference_mode()
    def _capture(self, bs: int) -> None:
        model = self.model
        ctx = self._context(bs)
        with forward_context(ctx):
            for _ in range(2):  # compile kernels and settle allocations outside the graph
                model.compute_logits(model(self.input_ids[:bs], self.positions[:bs]))
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with gc_paused(), torch.cuda.graph(graph, pool=self.pool):
                hidden = model(self.input_ids[:bs], self.positions[:bs])
                self.logits[bs] = model.compute_logits(hidden)
        torch.cuda.synchronize()
        self.graphs[bs] = graph

    def can_run(self, hb: HostBatch) -> bool:
        return (
            hb.is_decode
            and bool(self.graphs)
            and len(hb.seq_lens) <= max(self.graphs)
            and max(len(t) for t in hb.block_tables) <= self.width
        )

    def _load_inputs(self, hb: HostBatch, bs: int) -> None:
        """Write the batch (padding rows: slot -1 writes no KV, seq_len 0 attends to
        nothing, key -1 on the scratch state row) into a pinned buffer pair and send what
        the graph of size `bs` reads."""
        n, num = self.max_rows, len(hb.seq_lens)
        turn, self.turn = self.turn, 1 - self.turn
        if self.copied[turn] is not None:
            self.copied[turn].synchronize()  # its previous copy has left the buffer
        host64, host32 = self.host[turn]
        np64, np32 = host64.numpy(), host32.numpy()
        np64[:num] = hb.input_ids
        np64[n : n + num] = hb.positions
        np64[2 * n : 2 * n + num] = hb.slots
        np64[2 * n + num : 2 * n + bs] = -1
        np64[3 * n : 3 * n + num] = hb.request_rows
        np64[3 * n + num : 3 * n + bs] = self.scratch_row
        np64[4 * n : 4 * n + num] = hb.request_keys
        np64[4 * n + num : 4 * n + bs] = -1
        np32[:num] = hb.seq_lens
        np32[num:bs] = 0
        if self.has_state:
            np32[n : n + num] = hb.state_ids
            np32[n + num : n + bs] = -1
        tables = 2 * n
        for row, table in enumerate(hb.block_tables):
            np32[tables + row * self.width : tables + row * self.width + len(table)] = table
        self.dev64.copy_(host64, non_blocking=True)
        end = tables + bs * self.width
        self.dev32[:end].copy_(host32[:end], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.copied[turn] = event

    def run(self, hb: HostBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(S, V) float32 logits of the rows that sample; `input_ids` (a device tensor)
        replaces the batch's host-side ids (a look-ahead step's sampled tokens)."""
        num = len(hb.seq_lens)
        bs = min(b for b in self.graphs if b >= num)
        self._load_inputs(hb, bs)
        if input_ids is not None:
            self.input_ids[:num].copy_(input_ids)
        self.graphs[bs].replay()
        logits = self.logits[bs][:num]
        if len(hb.logits_indices) != num:  # a 1-token prefill chunk that does not sample
            logits = logits[torch.tensor(hb.logits_indices, device=logits.device)]
        return logits
