"""The engine step contract: `add_request` queues work; each `step()` is schedule → execute →
update and returns the per-request output deltas. Single-threaded; `async_engine` wraps it."""

from __future__ import annotations

import itertools
import logging
from dataclasses import replace

import torch

from xinfer.config import EngineConfig, ModelConfig
from xinfer.engine.kv_cache import BlockAllocator
from xinfer.engine.memory import check_weights_fit, plan_num_blocks
from xinfer.engine.output import OutputProcessor
from xinfer.engine.request import Request, RequestOutput
from xinfer.engine.scheduler import Scheduler
from xinfer.errors import UserError
from xinfer.runner.model_loader import build_model, resident_weight_bytes, resolve_dtype
from xinfer.runner.model_runner import ModelRunner
from xinfer.sampling import SamplingParams, make_generator
from xinfer.tokenizer import Tokenizer

logger = logging.getLogger("xinfer")


def model_max_len(cfg: ModelConfig) -> int:
    """The longest context the model was made for: `max_position_embeddings`, or, with
    linear / YaRN RoPE scaling, the original length times the scaling factor."""
    rope = cfg.rope
    if rope.rope_type in ("linear", "yarn") and rope.factor > 1:
        base = rope.original_max_position_embeddings or cfg.max_position_embeddings
        return max(cfg.max_position_embeddings, int(base * rope.factor))
    return cfg.max_position_embeddings


def resolve_max_model_len(cfg: ModelConfig, config: EngineConfig) -> int:
    """`--max-model-len`, or the model's own maximum; above that maximum only on request."""
    limit = model_max_len(cfg)
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit and not config.allow_long_max_model_len:
        raise UserError(
            f"--max-model-len {config.max_model_len} is above this model's maximum of {limit} "
            "tokens; lower it, or pass --allow-long-max-model-len if you know the model "
            "handles longer contexts"
        )
    return config.max_model_len


class Engine:
    def __init__(self, config: EngineConfig, show_progress: bool = True) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.model_config = cfg = ModelConfig.from_dir(config.model)
        self.tokenizer = Tokenizer.from_dir(config.model)
        self.max_model_len = resolve_max_model_len(cfg, config)
        self.dtype = resolve_dtype(cfg, config.dtype, self.device)
        offload = config.offload
        if offload.is_enabled and not cfg.is_moe:
            logger.info("model has no routed experts; MoE offload is ignored")
            offload = replace(offload, fraction=None, is_auto=False)
        self.offload_manager = None
        expert_device = torch.device("cpu") if offload.is_enabled else self.device
        if offload.is_enabled:  # before any expert is read: fail early if RAM is too small
            from xinfer.offload.host_store import check_host_ram_for_experts

            check_host_ram_for_experts(cfg, self.dtype)
        isq = None
        if config.isq is not None:
            from xinfer.quant.isq import isq_config

            isq = isq_config(config.isq, config.isq_dense, self.device)
        if self.device.type == "cuda":  # ...and if the GPU cannot hold what stays on it
            weights = resident_weight_bytes(
                cfg, self.dtype, self.max_model_len, not offload.is_enabled, config.model, isq
            )
            check_weights_fit(weights, self.device, config.gpu_memory_limit_gb, cfg.is_moe)
        self.model = build_model(
            config.model,
            cfg,
            self.device,
            self.dtype,
            self.max_model_len,
            expert_device,
            config.load_format,
            config.seed,
            show_progress,
            isq,
        )
        if offload.is_enabled:
            from xinfer.offload.setup import enable_offload

            self.offload_manager = enable_offload(self.model, config, offload, self.device)
        kv_dtype = config.cache.kv_dtype or self.dtype
        num_blocks = plan_num_blocks(cfg, config, self.device, kv_dtype, self.max_model_len)
        blocks_per_seq = -(-self.max_model_len // config.cache.block_size)
        if num_blocks < blocks_per_seq:
            raise UserError(
                f"the KV cache fits {num_blocks * config.cache.block_size} tokens, fewer than "
                f"--max-model-len {self.max_model_len}; lower --max-model-len or free memory"
            )
        self.kv_tokens = num_blocks * config.cache.block_size
        graphs = None
        if self.device.type == "cuda" and not config.enforce_eager:
            from xinfer.runner.cuda_graph import CudaGraphRunner

            graphs = CudaGraphRunner
        self.runner = ModelRunner(
            self.model,
            cfg,
            self.device,
            num_blocks,
            config.cache.block_size,
            kv_dtype,
            self.max_model_len,
            config.scheduler.max_num_seqs,
            graphs,
            self.offload_manager.is_graph_safe if self.offload_manager else None,
            look_ahead=self.device.type == "cuda"
            if config.decode_look_ahead is None
            else config.decode_look_ahead,
        )
        self.allocator = BlockAllocator(num_blocks, config.cache.block_size)
        self.scheduler = Scheduler(config.scheduler, self.allocator)
        self.eos_ids = set(self.tokenizer.eos_token_ids) if self.tokenizer else set()
        self.eos_ids |= set(cfg.eos_token_ids)
        self.outputs = OutputProcessor(self.tokenizer, self.eos_ids)
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        if self.device.type == "cuda":
            self.warm_up_prefill()
        if self.offload_manager is not None:
            self.offload_manager.reset_stats()  # warm-ups are not the user's traffic
        logger.info(
            "KV cache: %d tokens (%d blocks of %d), max model len %d",
            self.kv_tokens,
            num_blocks,
            config.cache.block_size,
            self.max_model_len,
        )

    def warm_up_prefill(self) -> None:
        """Run two throw-away prompts, one step's token budget long and one token shorter
        (Triton specialises sizes divisible by 16), so that the prefill kernels are compiled
        before the first user's long prompt waits for them. Leaves no request, block or
        output behind."""
        budget = min(self.config.scheduler.max_num_batched_tokens, self.max_model_len - 1)
        greedy_one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        for n in sorted({budget, budget - 1} - {0}, reverse=True):
            self.add_request([0] * n, greedy_one, request_id=f"xinfer-warm-up-{n}")
            while self.has_unfinished():
                self.step()

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise UserError("this model has no tokenizer files; pass token ids instead")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
            if any(not 0 <= t < self.model_config.vocab_size for t in ids):
                raise UserError(f"prompt token ids must be in [0, {self.model_config.vocab_size})")
        if not ids:
            raise UserError("the prompt is empty")
        if len(ids) >= self.max_model_len:
            raise UserError(
                f"the prompt has {len(ids)} tokens but --max-model-len is {self.max_model_len}; "
                "shorten the prompt or raise --max-model-len"
            )
        return ids

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        ids = self.encode_prompt(prompt)
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise UserError(f"request id {request_id!r} is already in use")
        gen = make_generator(params.seed, self.device) if params.seed is not None else None
        req = Request(request_id, ids, params, generator=gen, max_len=self.max_model_len)
        self.outputs.register(req)
        self.requests[request_id] = req
        self.scheduler.add(req)
        return request_id

    def abort_request(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.scheduler.finish(req, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def step(self) -> list[RequestOutput]:
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        tokens, logprobs = self.runner.execute(
            out, self.eos_ids, look_ahead=not self.scheduler.waiting
        )
        results: list[RequestOutput] = []
        sampled = iter(zip(tokens, logprobs))
        for s in out.scheduled:
            req = s.request
            req.num_computed_tokens += s.num_new_tokens
            if not s.samples:
                continue
            token, lp = next(sampled)
            delta = self.outputs.append(req, token, lp)
            if req.finish_reason is not None:
                self.scheduler.finish(req, req.finish_reason)
                self.requests.pop(req.request_id, None)
            results.append(delta)
        return results

    def offload_stats(self) -> dict | None:
        return None if self.offload_manager is None else self.offload_manager.stats()
