"""CUDA graphs for decode-only steps: one graph per batch size (every size up to 16, then
steps of 8), captured once over static input buffers that each replay refills. Smaller
batches are padded to the next captured size with rows that write no KV and attend to
nothing. Sizes that a layer cannot run without a host decision are left eager."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from xinfer.runner.forward_context import ForwardContext, forward_context

if TYPE_CHECKING:
    from xinfer.runner.model_runner import ModelRunner, StepInputs

logger = logging.getLogger("xinfer")


def capture_sizes(max_batch: int) -> list[int]:
    sizes = list(range(1, min(max_batch, 16) + 1))
    sizes += list(range(24, max_batch + 1, 8))
    if sizes[-1] < max_batch:
        sizes.append(max_batch)
    return sizes


class CudaGraphRunner:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        device = runner.device
        sizes = [b for b in capture_sizes(runner.max_num_seqs) if runner.is_graph_safe(b)]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if not sizes:
            logger.info("CUDA graphs: no batch size can be captured; decode runs eagerly")
            return
        n, w = max(sizes), runner.max_blocks_per_seq
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(n, w, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.pool = torch.cuda.graph_pool_handle()
        for bs in tqdm(sorted(sizes, reverse=True), desc="Capturing CUDA graphs"):
            self._capture(bs)

    def _context(self, bs: int) -> ForwardContext:
        return ForwardContext(
            slot_mapping=self.slot_mapping[:bs],
            block_tables=self.block_tables[:bs],
            seq_lens=self.seq_lens[:bs],
            query_start_loc=self.query_start_loc[: bs + 1],
            max_query_len=1,
            max_seq_len=self.runner.max_model_len,
        )

    @torch.inference_mode()
    def _capture(self, bs: int) -> None:
        model = self.runner.model
        ctx = self._context(bs)
        with forward_context(ctx):
            for _ in range(2):  # compile kernels and settle allocations outside the graph
                model(self.input_ids[:bs], self.positions[:bs])
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[bs] = model(self.input_ids[:bs], self.positions[:bs])
        torch.cuda.synchronize()
        self.graphs[bs] = graph

    def can_run(self, inp: StepInputs) -> bool:
        num = inp.input_ids.shape[0]
        return (
            inp.ctx.is_decode
            and bool(self.graphs)
            and num <= max(self.graphs)
            and inp.ctx.block_tables.shape[1] <= self.block_tables.shape[1]
        )

    def run(self, inp: StepInputs) -> torch.Tensor:
        num = inp.input_ids.shape[0]
        bs = min(b for b in self.graphs if b >= num)
        ctx = inp.ctx
        self.input_ids[:num].copy_(inp.input_ids)
        self.positions[:num].copy_(inp.positions)
        self.slot_mapping[:num].copy_(ctx.slot_mapping)
        self.slot_mapping[num:bs].fill_(-1)  # padding rows write no KV...
        self.seq_lens[:num].copy_(ctx.seq_lens)
        self.seq_lens[num:bs].fill_(0)  # ...and attend to nothing
        width = ctx.block_tables.shape[1]
        self.block_tables[:num, :width].copy_(ctx.block_tables)
        self.graphs[bs].replay()
        return self.outputs[bs][:num]
