"""Runs one scheduled step: packs the batch into flat tensors, sets the forward context,
runs the model (eagerly, or by replaying a captured CUDA graph for decode-only steps),
and samples the next token of every request whose known tokens are all in the cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xinfer.config import ModelConfig
from xinfer.engine.request import TokenLogprob
from xinfer.engine.scheduler import SchedulerOutput
from xinfer.models.moe_decoder import MoeForCausalLM
from xinfer.runner.forward_context import ForwardContext, forward_context
from xinfer.sampling import SamplingMetadata, sample


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # (T,)
    positions: torch.Tensor  # (T,)
    ctx: ForwardContext
    logits_indices: torch.Tensor  # (S,) rows of the hidden states that sample


class ModelRunner:
    def __init__(
        self,
        model: MoeForCausalLM,
        cfg: ModelConfig,
        device: torch.device,
        num_blocks: int,
        block_size: int,
        kv_dtype: torch.dtype,
        max_model_len: int,
        max_num_seqs: int = 64,
        graph_runner_factory=None,
        is_graph_safe=None,
    ) -> None:
        """`graph_runner_factory(runner)` builds the CUDA-graph runner (None: eager only);
        `is_graph_safe(batch_size)` says whether every layer can run that decode batch
        without a host decision (offload: the routed ids fit in the slots)."""
        self.model, self.cfg, self.device = model, cfg, device
        self.block_size, self.max_model_len = block_size, max_model_len
        self.max_num_seqs = max_num_seqs
        self.is_graph_safe = is_graph_safe or (lambda batch_size: True)
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = []
        for attn in model.attention_layers():
            k = torch.zeros(shape, dtype=kv_dtype, device=device)
            v = torch.zeros(shape, dtype=kv_dtype, device=device)
            attn.bind_kv_cache(k, v)
            self.kv_caches.append((k, v))
        self.graph_runner = graph_runner_factory(self) if graph_runner_factory else None

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        qsl = [0]
        logits_idx: list[int] = []
        tables = []
        for s in out.scheduled:
            req, start, n = s.request, s.start, s.num_new_tokens
            ids.extend(req.all_token_ids[start : start + n])
            positions = range(start, start + n)
            pos.extend(positions)
            slots.extend(req.block_ids[p // bs] * bs + p % bs for p in positions)
            seq_lens.append(start + n)
            qsl.append(qsl[-1] + n)
            tables.append(req.block_ids)
            if s.samples:
                logits_idx.append(qsl[-1] - 1)
        width = max(len(t) for t in tables)
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)

        def dev(x: list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(x, dtype=dtype).to(self.device, non_blocking=True)

        max_query_len = max(s.num_new_tokens for s in out.scheduled)
        ctx = ForwardContext(
            slot_mapping=dev(slots, torch.int64),
            block_tables=table.to(self.device, non_blocking=True),
            seq_lens=dev(seq_lens, torch.int32),
            query_start_loc=dev(qsl, torch.int32),
            max_query_len=max_query_len,
            # Decode attention sizes its split grid from this bound; the model length (the
            # bound CUDA graphs are captured with) keeps eager and graphed bits identical.
            max_seq_len=self.max_model_len if max_query_len == 1 else max(seq_lens),
        )
        return StepInputs(
            dev(ids, torch.int64), dev(pos, torch.int64), ctx, dev(logits_idx, torch.int64)
        )

    @torch.inference_mode()
    def forward(self, inp: StepInputs) -> torch.Tensor:
        """Hidden states (T, H) of the step."""
        if self.graph_runner is not None and self.graph_runner.can_run(inp):
            return self.graph_runner.run(inp)
        with forward_context(inp.ctx):
            return self.model(inp.input_ids, inp.positions)

    @torch.inference_mode()
    def execute(
        self, out: SchedulerOutput, eos_ids: set[int]
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """Run the step; returns the sampled token (and logprobs) of each sampling request,
        in the order of `out.scheduled`."""
        inp = self.prepare(out)
        hidden = self.forward(inp)
        sampling = [s for s in out.scheduled if s.samples]
        if not sampling:
            return [], []
        logits = self.model.compute_logits(hidden[inp.logits_indices])  # (S, V) float32
        reqs = [s.request for s in sampling]
        meta = SamplingMetadata.build(
            [r.params for r in reqs],
            [r.prompt_token_ids for r in reqs],
            [r.output_token_ids for r in reqs],
            [r.generator for r in reqs],
            logits.shape[-1],
            self.device,
            eos_token_ids=eos_ids,
        )
        result = sample(logits, meta)
        return result.token_ids, list(result.logprobs)
