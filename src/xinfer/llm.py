"""The Python API: `LLM(model, ...).generate(prompts, SamplingParams)` and `.chat(messages)`.
Batches all prompts through the engine's continuous batching and returns one result each."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from xinfer import envs
from xinfer.config import (
    CacheConfig,
    EngineConfig,
    OffloadConfig,
    SchedulerConfig,
    parse_dtype,
    parse_kv_dtype,
)
from xinfer.engine.engine import Engine
from xinfer.engine.request import TokenLogprob
from xinfer.errors import UserError
from xinfer.parallel.devices import resolve_parallel
from xinfer.sampling import SamplingParams

logger = logging.getLogger("xinfer")


def demo_model_path() -> str:
    return str(resources.files("xinfer") / "assets" / "demo")


def resolve_model_path(model: str | None) -> str:
    if model is None or model == "demo":
        path = demo_model_path()
        if not (Path(path) / "config.json").exists():
            raise UserError("the bundled demo model is missing from this install; pass --m PATH")
        return path
    return model


def default_device() -> str:
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def parse_device(device: str | None) -> str:
    """`None` → GPU 0 if present else CPU; "0" / "cuda:0" / "cpu" accepted."""
    if device is None:
        return default_device()
    d = str(device).strip()
    if d.isdigit():
        d = f"cuda:{d}"
    if d.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(f"device {device!r} asked for, but this machine has no CUDA GPU")
        idx = int(d.split(":")[1]) if ":" in d else 0
        if idx >= torch.cuda.device_count():
            raise UserError(f"GPU {idx} does not exist ({torch.cuda.device_count()} visible)")
        return f"cuda:{idx}"
    if d != "cpu":
        raise UserError(f"unknown device {device!r}; use cpu, a GPU index or cuda:N")
    return d


def offload_from_env(
    moe_offload: str | float | None = None,
    reserve_gb: float | None = None,
    profile: bool | None = None,
) -> OffloadConfig:
    """Options given explicitly (CLI flags, keyword arguments) win over the environment."""
    value = moe_offload if moe_offload is not None else envs.XINFER_MOE_OFFLOAD()
    reserve = reserve_gb if reserve_gb is not None else envs.XINFER_MOE_OFFLOAD_RESERVE_GB()
    prof = profile if profile is not None else envs.XINFER_MOE_OFFLOAD_PROFILE()
    return OffloadConfig.parse(value, reserve_gb=reserve, is_profile=prof)


@dataclass
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)


class LLM:
    def __init__(
        self,
        model: str | None = "demo",
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        max_model_len: int | None = None,
        load_format: str = "auto",
        moe_offload: str | float | None = None,
        moe_offload_reserve_gb: float | None = None,
        moe_offload_profile: bool | None = None,
        gpu_memory_limit_gb: float | None = None,
        enforce_eager: bool = False,
        decode_look_ahead: bool | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        block_size: int = 16,
        num_kv_blocks: int | None = None,
        kv_cache_dtype: str | None = None,
        seed: int = 0,
        show_progress: bool = False,
    ) -> None:
        device, parallel = resolve_parallel(device)  # "0,1" / "cpu,cpu": tensor parallel
        config = EngineConfig(
            model=resolve_model_path(model),
            device=device,
            parallel=parallel,
            dtype=parse_dtype(dtype),
            max_model_len=max_model_len,
            load_format=load_format,
            seed=seed,
            enforce_eager=enforce_eager,
            decode_look_ahead=decode_look_ahead,
            gpu_memory_limit_gb=gpu_memory_limit_gb,
            cache=CacheConfig(
                block_size=block_size,
                num_blocks=num_kv_blocks,
                kv_dtype=parse_kv_dtype(kv_cache_dtype),
            ),
            offload=offload_from_env(moe_offload, moe_offload_reserve_gb, moe_offload_profile),
            scheduler=SchedulerConfig(
                max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
            ),
        )
        self.engine = Engine(config, show_progress=show_progress)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | list[int] | list[str | list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[GenerationResult]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # a single prompt
        params_list = (
            params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        )
        if len(params_list) != len(prompts):
            raise UserError("give one SamplingParams, or one per prompt")
        results: dict[str, GenerationResult] = {}
        order = []
        for prompt, p in zip(prompts, params_list):
            rid = self.engine.add_request(prompt, p)
            results[rid] = GenerationResult(self.engine.requests[rid].prompt_token_ids)
            order.append(rid)
        while self.engine.has_unfinished():
            for delta in self.engine.step():
                r = results[delta.request_id]
                r.token_ids.extend(delta.new_token_ids)
                r.text += delta.new_text
                r.logprobs.extend(delta.new_logprobs)
                if delta.finished:
                    r.finish_reason, r.stop_reason = delta.finish_reason, delta.stop_reason
        return [results[rid] for rid in order]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        params: SamplingParams | None = None,
    ) -> list[GenerationResult]:
        if self.tokenizer is None:
            raise UserError("this model has no tokenizer files, so it cannot chat")
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            self.tokenizer.encode(
                self.tokenizer.apply_chat_template(c, add_generation_prompt=True),
                add_special_tokens=False,  # the template writes any BOS itself
            )
            for c in convs
        ]
        return self.generate(prompts, params)

    def offload_stats(self) -> dict | None:
        """Per-layer and total expert-cache statistics, or None when offload is off."""
        return self.engine.offload_stats()

    def close(self) -> None:
        """Stop the other tensor-parallel ranks now (else at exit); one device: a no-op."""
        self.engine.close()
