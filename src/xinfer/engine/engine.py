"""The engine step contract: `add_request` queues work; each `step()` is schedule → execute →
update and returns the per-request output deltas. Single-threaded; `async_engine` wraps it."""

from __future__ import annotations

import itertools
import logging
import operator
import time
from dataclasses import replace

import torch

from xinfer import envs
from xinfer.config import EngineConfig, ModelConfig
from xinfer.engine.kv_cache import BlockAllocator
from xinfer.engine.memory import (
    kv_shortfall_reason,
    min_free_gpu_bytes,
    plan_num_blocks,
    usable_gpu_bytes,
)
from xinfer.engine.output import OutputProcessor
from xinfer.engine.prefix_cache import PrefixCacheStats
from xinfer.engine.request import Request, RequestOutput
from xinfer.engine.scheduler import Scheduler
from xinfer.engine.state_cache import StateSlotAllocator, plan_state_slots
from xinfer.engine.stats import StatsLogger, startup_summary
from xinfer.errors import UserError
from xinfer.parallel.run import start_tensor_parallel
from xinfer.runner.model_loader import build_model, plan_weights, resolve_dtype
from xinfer.runner.model_runner import ModelRunner
from xinfer.sampling import SamplingParams, make_generator
from xinfer.structured import GrammarCompiler
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
        t_start = time.monotonic()
        # seconds of each start-up phase, in order (the startup line and the benchmarks show
        # them: a slow start says where its time went)
        self.startup_phases: dict[str, float] = {}
        phase_start = [t_start]

        # free GPU bytes (as `--gpu-memory-limit-gb` counts them) after each phase, on CUDA:
        # a KV cache that comes out short names the phase that took the memory
        self.startup_free: dict[str, int] = {}

        def phase_done(name: str) -> None:
            now = time.monotonic()
            self.startup_phases[name] = now - phase_start[0]
            phase_start[0] = now
            self._note_free(name)

        self.config = config
        # the kernel switches are read at every call: a bad value fails here, before loading
        envs.XINFER_DISABLE_TRITON()
        from xinfer.kernels import pdl  # (a launch reads the module flag, not the variable)

        pdl.ENABLED = envs.XINFER_PDL()
        envs.XINFER_PREFILL_ATTENTION()
        self.device = torch.device(config.device)
        self.model_config = cfg = ModelConfig.from_dir(config.model)
        self.tokenizer = Tokenizer.from_dir(config.model)
        self.max_model_len = resolve_max_model_len(cfg, config)
        self.dtype = resolve_dtype(cfg, config.dtype, self.device)
        self.tp = start_tensor_parallel(config, self)  # None with one device
        if self.tp is not None:  # this rank's heads and intermediate sizes and options
            self.model_config = cfg = self.tp.shard_config(cfg)
            config = self.config = self.tp.rank_engine_config(config)
        offload = config.offload
        if offload.is_enabled and not cfg.is_moe:
            logger.info("model has no routed experts; MoE offload is ignored")
            offload = replace(
                offload, fraction=None, is_auto=False, prefetch_distance=0, fill="kernel"
            )
        self.offload_manager = None
        # Fraction 1.0 keeps every expert on the device: build them there, never on the host.
        from xinfer.offload.setup import check_fill, keeps_every_expert

        check_fill(offload, self.device)  # before any weight is read

        isq = None
        if config.isq is not None:
            from xinfer.quant.isq import isq_config

            isq = isq_config(config.isq, config.isq_dense, self.device)
        experts_on_host = offload.is_enabled and not keeps_every_expert(offload)
        expert_device = torch.device("cpu") if experts_on_host else self.device
        # before any weight is read: host RAM for offloaded experts, the GPU for the rest,
        # in the checkpoint's formats (quantized sizes)
        self.weight_plan = plan_weights(
            cfg, self.dtype, self.max_model_len, experts_on_host, config.model, isq
        )
        self.weight_plan.check(self.device, config.gpu_memory_limit_gb, cfg.is_moe)
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
        phase_done("weights")
        kv_dtype = config.cache.kv_dtype or self.dtype
        look_ahead = self._look_ahead(config)
        # hybrid models: one recurrent-state slot per running request, from the same budget;
        # two rows each under decode look-ahead (a dropped queued step must be undoable)
        self.state_copies = 2 if look_ahead else 1
        if offload.is_enabled:
            from xinfer.offload.setup import enable_offload

            one_seq = 0  # on CPU the KV cache does not come from the device budget
            if self.device.type == "cuda":
                one_seq = min_free_gpu_bytes(
                    cfg,
                    config,
                    kv_dtype,
                    self.max_model_len,
                    cfg.state_bytes_per_seq(self.dtype) * self.state_copies,
                )
            self.offload_manager = enable_offload(
                self.model, config, offload, self.device, min_free_bytes=one_seq
            )
            planned = self.offload_manager.planned_free_bytes
            if planned is not None:  # a KV cache that comes out short compares with it
                self.startup_free["offload plan"] = planned
            phase_done("offload")
        self.num_state_slots = plan_state_slots(
            cfg, config, self.device, self.dtype, kv_dtype, self.max_model_len, self.state_copies
        )
        if self.tp is not None:  # rank 0's slot ids index every rank's state
            self.num_state_slots = self.tp.agree_min(self.num_state_slots)
        if self.num_state_slots:
            scheduler_config = replace(config.scheduler, max_num_seqs=self.num_state_slots)
            config = self.config = replace(config, scheduler=scheduler_config)
        self._note_free("state slots")
        self.routing = self._install_routing(config)  # its per-request rows: the runner's
        self._note_free("routing")
        if self.offload_manager is not None and offload.prefetch_layers:
            from xinfer.offload.prefetch_setup import install_prefetch

            max_decode = config.scheduler.max_num_seqs  # the widest call that predicts
            install_prefetch(self.model, self.offload_manager, offload, self.routing, max_decode)
            self._note_free("prefetch")
        per_seq = cfg.state_bytes_per_seq(self.dtype) * self.state_copies
        self.state_bytes = self.num_state_slots * per_seq
        self._note_free("kv sizing")
        num_blocks = plan_num_blocks(
            cfg, config, self.device, kv_dtype, self.max_model_len, reserved_bytes=self.state_bytes
        )
        if self.tp is not None:
            num_blocks = self.tp.agree_min(num_blocks)  # rank 0's tables index every cache
        blocks_per_seq = -(-self.max_model_len // config.cache.block_size)
        if num_blocks < blocks_per_seq:
            fix = (
                f"raise --num-kv-blocks ({blocks_per_seq} hold one sequence)"
                if config.cache.num_blocks is not None
                else "free memory"
            )
            raise UserError(
                f"the KV cache fits {num_blocks * config.cache.block_size} tokens, fewer than "
                f"--max-model-len {self.max_model_len}; lower --max-model-len or {fix}"
                + kv_shortfall_reason(
                    self.startup_free, self.offload_manager is not None, offload.is_auto
                )
            )
        self.kv_tokens = num_blocks * config.cache.block_size
        graphs = None
        if self.device.type == "cuda" and not config.enforce_eager:
            from xinfer.runner.cuda_graph import CudaGraphRunner

            graphs = CudaGraphRunner
        make_runner, is_graph_safe = ModelRunner, None
        if self.offload_manager is not None:
            is_graph_safe = self.offload_manager.is_graph_safe
        if self.tp is not None:
            make_runner = self.tp.runner_class()
            is_graph_safe = self.tp.agree_graph_sizes(is_graph_safe, config.scheduler.max_num_seqs)
        self.runner = make_runner(
            self.model,
            cfg,
            self.device,
            num_blocks,
            config.cache.block_size,
            kv_dtype,
            self.max_model_len,
            config.scheduler.max_num_seqs,
            graphs,
            is_graph_safe,
            look_ahead=look_ahead,
            observer=self.routing if self.routing and self.routing.recorder else None,
            num_state_slots=self.num_state_slots,
            state_dtype=self.dtype,
            state_copies=self.state_copies,
            layer_hooks=self.offload_manager.layer_streamer if self.offload_manager else None,
            model_dtype=self.dtype,
        )
        phase_done("runner")  # KV cache and, on a GPU, the decode graphs' capture
        self.allocator = BlockAllocator(
            num_blocks, config.cache.block_size, self._use_prefix_caching()
        )
        slots = StateSlotAllocator(self.num_state_slots) if self.num_state_slots else None
        # Long prompts run as layer-by-layer passes where the model offers a layer stack.
        layered = self.runner.prompt_pass.stack is not None and self.tp is None
        self.scheduler = Scheduler(config.scheduler, self.allocator, slots, layered)
        self.eos_ids = set(self.tokenizer.eos_token_ids) if self.tokenizer else set()
        self.eos_ids |= set(cfg.eos_token_ids)
        self.outputs = OutputProcessor(self.tokenizer, self.eos_ids)
        self.requests: dict[str, Request] = {}
        self._grammar_compiler: GrammarCompiler | None = None
        self._ids = itertools.count()
        if self.tp is not None:  # a follower runs rank 0's steps from here on, then exits
            self.tp.start_following(self)
            self.offload_manager = self.tp.offload_view(self.offload_manager)
        self.stats_logger = StatsLogger(config.log_stats_interval_s)  # steps report to it
        if self.device.type == "cuda":
            self.warm_up_prefill()
            phase_done("warm-up")
        self.allocator.reset_prefix_cache()  # warm-ups are not the user's traffic
        if self.offload_manager is not None:
            self.offload_manager.reset_stats()
        self.runner.request_slots.reset()  # request keys (routing streams) start at 0
        if self.routing is not None:
            self.routing.start()
        if self.tp is not None:
            self.tp.end_warm_up()  # the followers forget the warm-up's routing state too
        self.stats_logger.reset(self)
        load_s = time.monotonic() - t_start
        plan = self.weight_plan
        expert_bytes = plan.host_expert_bytes
        weight_bytes = plan.device_bytes + (expert_bytes if plan.is_offloaded else 0)
        logger.info("%s", startup_summary(self, load_s, weight_bytes, expert_bytes))

    def _note_free(self, step: str) -> None:
        """Record the free GPU bytes after start-up step `step` (CUDA only)."""
        if self.device.type == "cuda":
            self.startup_free[step] = usable_gpu_bytes(self.device, self.config.gpu_memory_limit_gb)

    def _use_prefix_caching(self) -> bool:
        """On unless switched off, or the model keeps per-request state (a recurrent
        linear-attention state) that cached KV blocks cannot rebuild."""
        if not self.config.enable_prefix_caching:
            return False
        if not getattr(self.model, "supports_prefix_caching", True):
            logger.info(
                "prefix caching is off: %s keeps per-request state that KV blocks cannot restore",
                self.model_config.architecture,
            )
            return False
        return True

    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        cache = self.allocator.prefix_cache
        return None if cache is None else cache.stats

    def _install_routing(self, config: EngineConfig):
        """The routing source / recorder of `config.routing` on the MoE layers (None: the
        router's own choice, nothing recorded, nothing installed)."""
        from xinfer.routing.install import install_routing
        from xinfer.runner.request_slots import request_row_capacity

        sched = config.scheduler
        return install_routing(
            self.model,
            config.routing,
            self.device,
            num_rows=request_row_capacity(sched.max_num_seqs),
            max_tokens=max(sched.max_num_batched_tokens, sched.max_num_seqs),
            model_name=config.model,
            is_dummy=config.load_format == "dummy",
        )

    def _look_ahead(self, config: EngineConfig) -> bool:
        """Decode look-ahead (on CUDA unless set); off while recording routing, which
        records each step after its forward (a queued step would be missed or doubled)."""
        if config.routing.record_path is not None:
            return False
        return (
            self.device.type == "cuda"
            if config.decode_look_ahead is None
            else bool(config.decode_look_ahead)
        )

    def warm_up_prefill(self) -> None:
        """Run throw-away prompts so that the prefill kernels are compiled before the first
        user's long prompt waits for them: one step's token budget long, one token shorter
        (Triton specialises sizes divisible by 16), and, where the context and the KV pool
        allow, 2·budget − 1 tokens — a prompt longer than the budget: the prompt pass (and
        under offload its expert streaming) and chunks attending to a prefix. Leaves no
        request, block or output behind."""
        budget = min(self.config.scheduler.max_num_batched_tokens, self.max_model_len - 1)
        kv_tokens = self.allocator.num_blocks * self.allocator.block_size
        lengths = {budget, budget - 1}
        if 2 * budget - 1 < min(self.max_model_len, kv_tokens):
            lengths.add(2 * budget - 1)
        greedy_one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        vocab = self.model_config.vocab_size
        for i, n in enumerate(sorted(lengths - {0}, reverse=True)):
            # a token of its own per prompt: none is a cached prefix of another, so each
            # computes all its tokens (with prefix caching on)
            self.add_request([i % vocab] * n, greedy_one, request_id=f"xinfer-warm-up-{n}")
            while self.has_unfinished():
                self.step()

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise UserError("this model has no tokenizer files; pass token ids instead")
            ids = self.tokenizer.encode(prompt)
        else:
            vocab = self.model_config.vocab_size
            try:  # ints of any kind (numpy's too), never floats, strings or bools
                if isinstance(prompt, (bytes, dict)) or any(isinstance(t, bool) for t in prompt):
                    raise TypeError
                ids = [operator.index(t) for t in prompt]
            except TypeError:
                raise UserError(
                    f"a prompt must be a string or a list of token ids, got {prompt!r:.80}"
                ) from None
            if any(not 0 <= t < vocab for t in ids):
                raise UserError(f"prompt token ids must be in [0, {vocab})")
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
        if params.grammar is not None:
            req.grammar = self.grammar_compiler.matcher(params.grammar)
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
        step_start = time.monotonic()
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        self.stats_logger.begin_step()
        for s in out.scheduled:
            if s.request.scheduled_time is None:
                s.request.scheduled_time = step_start
        tokens, logprobs = self.runner.execute(
            out, self.eos_ids, look_ahead=not self.scheduler.waiting
        )
        now = time.monotonic()
        results: list[RequestOutput] = []
        sampled = iter(zip(tokens, logprobs))
        num_decodes = 0  # rows that computed one generated token (the rest is prompt work)
        for s in out.scheduled:
            req = s.request
            num_decodes += s.num_new_tokens == 1 and s.start >= len(req.prompt_token_ids)
            req.num_computed_tokens += s.num_new_tokens
            self.scheduler.cache_computed_blocks(req)
            if not s.samples:
                continue
            token, lp = next(sampled)
            if req.first_token_time is None:
                req.first_token_time = now
            delta = self.outputs.append(req, token, lp)
            if req.finish_reason is not None:
                req.finished_time = now
                delta.metrics = req.metrics()
                self.scheduler.finish(req, req.finish_reason)
                self.requests.pop(req.request_id, None)
            results.append(delta)
        num_prompt = sum(s.num_new_tokens for s in out.scheduled) - num_decodes
        self.stats_logger.record_step(num_prompt, len(results))
        self.stats_logger.maybe_log(self)
        return results

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        """Structured output's grammar compiler for this model (built on first use)."""
        if self._grammar_compiler is None:
            if self.tokenizer is None:
                raise UserError("structured output needs the model's tokenizer files")
            vocab = self.model_config.vocab_size
            try:
                self._grammar_compiler = GrammarCompiler(self.tokenizer, vocab, self.eos_ids)
            except Exception as e:  # noqa: BLE001 - a tokenizer llguidance cannot read
                message = f"structured output is not available for this tokenizer: {e}"
                raise UserError(message) from None
        return self._grammar_compiler

    def offload_stats(self) -> dict | None:
        return None if self.offload_manager is None else self.offload_manager.stats()

    def close(self) -> None:
        """Flush and close what the engine writes (the routing trace) and stop the other
        tensor-parallel ranks (nothing to do with one device); idempotent."""
        if self.routing is not None:
            self.routing.close()
        if self.tp is not None:
            self.tp.close()
