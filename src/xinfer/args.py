"""The engine's options, declared once (like vLLM's `EngineArgs`): `EngineArgs` builds the
`EngineConfig` for both the command line and `LLM(...)`; `parse_device` reads one device and
`offload_from_env` the offload settings with their variables. Adding an engine option is one
`option(...)` line here plus the code that reads it; the parser, `--help` and `LLM`'s
keywords follow. The command line's other groups and its parser are in `cli_args.py`."""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, fields
from typing import Any

import torch

from xinfer import envs
from xinfer.config import (
    DEFAULT_PREFETCH_DISTANCE,
    DEFAULT_PREFETCH_MARGIN,
    MAX_PREFETCH_DISTANCE,
    OFFLOAD_FILLS,
    OFFLOAD_POLICIES,
    PREFETCH_ISSUE_POINTS,
    STREAM_BUFFER_CHOICES,
    CacheConfig,
    EngineConfig,
    OffloadConfig,
    SchedulerConfig,
    parse_dtype,
    parse_kv_dtype,
    parse_stream_buffers,
)
from xinfer.errors import UserError
from xinfer.model_source import resolve_model
from xinfer.options import OptionSet, above, at_least, option, within
from xinfer.parallel.devices import resolve_parallel
from xinfer.routing.config import PRESETS, ROUTER, RoutingConfig

logger = logging.getLogger("xinfer")


def parse_device(device: str | None) -> str:
    """`None` → GPU 0 if present else CPU; "0" / "cuda:0" / "cpu" accepted."""
    if device is None:
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    d = str(device).strip()
    if "," in d:  # several devices go through xinfer.parallel.devices.resolve_parallel
        raise UserError(f"give one device here, not {device!r}")
    if d.isdigit():
        d = f"cuda:{d}"
    if d.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(f"device {device!r} asked for, but this machine has no CUDA GPU")
        idx = d.split(":")[1] if ":" in d else "0"
        if not idx.isdigit():
            raise UserError(f"unknown device {device!r}; use cpu, a GPU index or cuda:N")
        if int(idx) >= torch.cuda.device_count():
            raise UserError(f"GPU {idx} does not exist ({torch.cuda.device_count()} visible)")
        return f"cuda:{int(idx)}"
    if d != "cpu":
        raise UserError(f"unknown device {device!r}; use cpu, a GPU index or cuda:N")
    return d


def _parses(fn) -> Any:
    """A check that runs a parser for its UserError and accepts whatever it returns."""
    return lambda value: (fn(value), None)[1]


def _power_of_two(value: int) -> str | None:
    return None if value > 0 and not value & (value - 1) else "must be a positive power of two"


def _refuse_speculation(value: int) -> str | None:
    if value == 0:
        return None
    raise UserError(
        "speculative decoding (--num-speculative-tokens) is not implemented in xinfer; "
        "leave it at 0"
    )


@dataclass
class EngineArgs(OptionSet):
    """The engine's options; the command line and `LLM(model, **options)` both build one."""

    GROUP = "engine"

    model: str | None = option(
        "demo",
        "a HF model directory, a Hugging Face repo id (org/name), or 'demo' (bundled)",
        flags=("--m", "--model"),
        metavar="MODEL",
    )
    device: str | None = option(
        None,
        "cpu, a GPU index or cuda:N (default: GPU 0 when there is one, else cpu); several, "
        "comma-separated, for tensor parallelism: 0,1 (or cpu,cpu)",
        flags=("--d", "--device"),
        check=_parses(resolve_parallel),
        metavar="DEV",
    )
    dtype: str | torch.dtype | None = option(
        "auto", "weights dtype: auto (the checkpoint's), float32, bfloat16, float16",
        check=_parses(parse_dtype), metavar="DTYPE",
    )  # fmt: skip
    max_model_len: int | None = option(
        None, "context length in tokens (default: the model's)", check=at_least(1)
    )
    allow_long_max_model_len: bool = option(
        False, "accept a --max-model-len above the model's own maximum (it may degrade output)"
    )
    load_format: str = option(
        "auto", "auto: the checkpoint's weights; dummy: random weights (benchmarks)",
        choices=("auto", "dummy"),
    )  # fmt: skip
    dummy_weights_seed: int = option(0, "seed of the random weights of --load-format dummy")
    enforce_eager: bool = option(
        False,
        "run every step eagerly (no CUDA graphs)",
        flags=("--disable-cuda-graph", "--enforce-eager"),
    )
    decode_look_ahead: bool | None = option(
        None, "queue the next decode step before reading this one's tokens (auto: on CUDA)"
    )
    enable_prefix_caching: bool = option(
        True, "reuse the computed KV blocks of prompts that start alike (prefix caching)"
    )
    kv_cache_dtype: str | None = option(
        "auto",
        "KV cache dtype: auto (the model's), bf16, fp16, fp8 (e4m3), turbo4 or turbo3 "
        "(TurboQuant: ~3.9x / ~5.1x more tokens than bf16; head_dim a multiple of 8)",
        flags=("--kvcache-dtype", "--kv-cache-dtype"),
        check=_parses(parse_kv_dtype),
        metavar="DTYPE",
    )
    block_size: int = option(16, "tokens per KV cache block", check=_power_of_two)
    num_kv_blocks: int | None = option(
        None, "KV cache blocks (default: sized from free memory)", check=at_least(1)
    )
    gpu_memory_utilization: float = option(
        0.9, "share of free GPU memory the KV cache may take", check=within(0.05, 1.0)
    )
    gpu_memory_limit_gb: float | None = option(
        None, "size everything as if the GPU had this many GB", check=above(0)
    )
    max_num_seqs: int = option(64, "most requests in one batch", check=at_least(1))
    max_num_batched_tokens: int = option(
        2048, "token budget of one step (prompt chunks plus decodes)", check=at_least(16)
    )
    max_waiting: int = option(
        256, "bounded request queue of the server (beyond it: HTTP 503)", check=at_least(1)
    )
    moe_offload: str | float | None = option(
        None,
        "share of each MoE layer's experts kept on the GPU: a fraction in (0, 1] or auto",
        env=envs.XINFER_MOE_OFFLOAD,
        check=_parses(OffloadConfig.parse),
        metavar="F|auto",
    )
    moe_offload_reserve_gb: float | None = option(
        None,
        "GPU memory (GB) that --moe-offload auto leaves free (default 2.5)",
        env=envs.XINFER_MOE_OFFLOAD_RESERVE_GB,
        check=at_least(0),
    )
    moe_offload_profile: bool | None = option(
        None,
        "time each MoE call's parts (slower: no CUDA graphs)",
        env=envs.XINFER_MOE_OFFLOAD_PROFILE,
    )
    moe_prefetch: int | None = option(
        None,
        "prefetch each offloaded MoE layer's predicted experts this many layers ahead "
        f"(default {DEFAULT_PREFETCH_DISTANCE} with MoE offload, see docs/moe_offload.md; "
        "0 = off)",
        check=within(0, MAX_PREFETCH_DISTANCE),
        metavar="LAYERS",
    )
    moe_prefetch_margin: float | None = option(
        None,
        "prefetch only predicted experts whose score beats the (k+1)-th by this much "
        f"(default {DEFAULT_PREFETCH_MARGIN}; 0 on 4-bit experts gained 5%% on the H100, "
        "see docs/moe_offload.md)",
        check=at_least(0),
    )
    moe_offload_fill: str = option(
        "kernel",
        "how decode graphs copy missed experts to the GPU: kernel (GPU programs read the "
        "pinned host store) or copy-engine (the DMA engines; needs a CUDA 12.8 driver; "
        "experimental, see docs/moe_offload.md)",
        choices=OFFLOAD_FILLS,
    )
    moe_offload_policy: str | None = option(
        None,
        "which expert a miss evicts from a layer's GPU slots: lfu (the default: least often "
        "used lately, a count decayed by 7/8 a call; a miss whose count is below its "
        "victim's is used from a call-local row instead of evicting it) or lru (least "
        "recently used)",
        env=envs.XINFER_MOE_OFFLOAD_POLICY,
        choices=OFFLOAD_POLICIES,
    )
    moe_offload_compress: bool | None = option(
        None,
        "keep bf16 offloaded experts packed in host RAM, 12 bits an element (lossless: each "
        "exponent as a 4-bit code): a miss moves 3/4 of the bytes and the pinned store is "
        "3/4 the size; the fill kernel unpacks them bit for bit (not with the copy-engine "
        "fill; other formats stay as they are)",
        env=envs.XINFER_MOE_OFFLOAD_COMPRESS,
    )
    moe_offload_stream_buffers: str | int = option(
        "auto",
        "the prompt pass's device buffers for offloaded experts (E - S experts each): 2 copy "
        "a layer while the previous one computes; 1 gives the second buffer's memory to the "
        "slots (fewer misses in decode under a tight budget), but a long prompt's copies and "
        "compute then take turns (its first token up to ~30%% later); auto: 1 where that buys "
        "at least a fifth more slots, see docs/moe_offload.md",
        check=_parses(parse_stream_buffers),
        metavar="{" + ",".join(STREAM_BUFFER_CHOICES) + "}",
    )
    moe_prefetch_fill: str | None = option(
        None,
        "how prefetch copies move to the GPU (default: as --moe-offload-fill): kernel or "
        "copy-engine (its copies use no SM, so the compute they overlap is not slowed)",
        choices=OFFLOAD_FILLS,
    )
    moe_prefetch_programs: int | None = option(
        None,
        "programs of the prefetch fill kernel (default: 16, 64 with --moe-offload-compress, "
        "whose fill keeps less in flight a program); fewer leave more of the GPU "
        "to the compute the copies overlap, at the copies' rate",
        check=at_least(1),
        metavar="N",
    )
    moe_prefetch_issue: str = option(
        "after-fill",
        "where layer l issues the prefetch of layer l + distance: after-fill (after l's own "
        "demand fill, so the two do not share the link) or before-lookup",
        choices=PREFETCH_ISSUE_POINTS,
    )
    routing_source: str = option(
        ROUTER,
        "benchmarks with dummy weights: where MoE layers' experts come from: router (the "
        "model's own), a routing-model preset (" + ", ".join(PRESETS) + "), "
        "model:SIGMA,TAU,PHI or replay:PATH (a --record-routing file)",
        check=_parses(lambda value: RoutingConfig(value)),
        metavar="SOURCE",
    )
    routing_seed: int = option(0, "seed of the routing model (expert popularity, request noise)")
    record_routing: str | None = option(
        None,
        "write the experts every MoE layer routed to, step by step, to this file "
        "(format: docs/moe_offload.md; turns decode look-ahead off)",
        metavar="PATH",
    )
    log_stats_interval: float | None = option(
        None,
        "seconds between engine stats lines while busy, 0 = none "
        "(default: 10 when serving, none for --prompt, --chat and LLM)",
        check=at_least(0),
    )
    isq: str | None = option(
        None,
        "quantize a bf16/fp16 checkpoint's routed experts at load to this GGUF block type "
        "(K-quants fall back to Q5_0/Q8_0 for rows not a multiple of 256)",
        choices=("q8_0", "q4k", "q6k", "q4_0"),
    )
    isq_dense: bool = option(
        False, "with --isq, also quantize the dense linear weights (not routers or the LM head)"
    )
    num_speculative_tokens: int = option(
        0, "speculative decoding (not implemented: only 0)", check=_refuse_speculation
    )

    def offload_config(self) -> OffloadConfig:
        """Offload settings: each option given wins over its `XINFER_MOE_OFFLOAD*` variable.
        Without offload, a setting of offload given as an option is refused; the same set
        only in the environment (a variable exported for every run) is dropped with a
        warning."""
        offload = self.value("moe_offload")
        settings = {  # OffloadConfig field: (option, the value that changes nothing)
            "policy": ("moe_offload_policy", None),
            "compress": ("moe_offload_compress", False),
            "is_profile": ("moe_offload_profile", False),
        }
        kw = {}
        for key, (name, inert) in settings.items():
            value = self.value(name)
            if value is None or value == inert:
                continue
            if offload in (None, ""):
                flag = self.flag(name) + ("" if isinstance(value, bool) else f" {value}")
                if getattr(self, name) is not None:
                    raise UserError(
                        f"{flag} applies to MoE expert offload: it needs --moe-offload (or "
                        "XINFER_MOE_OFFLOAD)"
                    )
                env = next(f for f in fields(self) if f.name == name).metadata["env"]
                logger.warning(
                    "%s=%s has no effect without MoE expert offload (--moe-offload)",
                    env.__name__,
                    value,
                )
                continue
            kw[key] = value
        self._check_reserve(offload)
        return OffloadConfig.parse(
            offload,
            reserve_gb=self.value("moe_offload_reserve_gb"),
            prefetch_distance=self.moe_prefetch,
            prefetch_margin=self.moe_prefetch_margin,
            fill=self.moe_offload_fill,
            prefetch_fill=self.moe_prefetch_fill,
            prefetch_programs=self.moe_prefetch_programs,
            prefetch_issue=self.moe_prefetch_issue,
            stream_buffers=parse_stream_buffers(self.moe_offload_stream_buffers),
            **kw,
        )

    def _warn_gpu_only(self, is_offload: bool) -> None:
        """On cpu the GPU memory options size nothing (the limit still sizes MoE offload's
        slots): said rather than dropped silently."""
        unused = []
        if self.gpu_memory_limit_gb is not None and not is_offload:
            unused.append(f"--gpu-memory-limit-gb {self.gpu_memory_limit_gb:g}")
        if self.flag("gpu_memory_utilization") in self.changed():
            unused.append(f"--gpu-memory-utilization {self.gpu_memory_utilization:g}")
        for flag in unused:
            logger.warning("%s has no effect on cpu (it sizes GPU memory)", flag)

    def _check_reserve(self, offload: str | float | None) -> None:
        """The reserve sizes what `auto` leaves free: refused as an option without `auto`,
        dropped with a warning as a variable."""
        if isinstance(offload, str) and offload.strip().lower() == "auto":
            return
        if self.moe_offload_reserve_gb is not None:
            raise UserError(
                f"--moe-offload-reserve-gb {self.moe_offload_reserve_gb:g} sizes what "
                "--moe-offload auto leaves free: it needs --moe-offload auto (or "
                "XINFER_MOE_OFFLOAD=auto)"
            )
        if envs.is_set("XINFER_MOE_OFFLOAD_RESERVE_GB"):
            logger.warning(
                "XINFER_MOE_OFFLOAD_RESERVE_GB=%g has no effect without --moe-offload auto",
                self.value("moe_offload_reserve_gb"),
            )

    def create_engine_config(self) -> EngineConfig:
        device, parallel = resolve_parallel(self.device)  # several devices: tensor parallel
        offload = self.offload_config()
        if device == "cpu":
            self._warn_gpu_only(offload.is_enabled)
        return EngineConfig(
            model=resolve_model(self.model),
            device=device,
            parallel=parallel,
            dtype=parse_dtype(self.dtype),
            max_model_len=self.max_model_len,
            allow_long_max_model_len=self.allow_long_max_model_len,
            load_format=self.load_format,
            seed=self.dummy_weights_seed,
            enforce_eager=self.enforce_eager,
            decode_look_ahead=self.decode_look_ahead,
            enable_prefix_caching=self.enable_prefix_caching,
            log_stats_interval_s=self.log_stats_interval or 0.0,
            gpu_memory_limit_gb=self.gpu_memory_limit_gb,
            isq=self.isq,
            isq_dense=self.isq_dense,
            cache=CacheConfig(
                block_size=self.block_size,
                num_blocks=self.num_kv_blocks,
                kv_dtype=parse_kv_dtype(self.kv_cache_dtype),
                gpu_memory_utilization=self.gpu_memory_utilization,
            ),
            offload=offload,
            scheduler=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_waiting=self.max_waiting,
            ),
            routing=RoutingConfig(self.routing_source, self.routing_seed, self.record_routing),
        )

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineArgs:
        """`LLM(...)`'s keywords; an unknown one is a UserError naming the closest option."""
        known = {f.name for f in fields(cls)}
        for name in kwargs:
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise UserError(f"unknown option {name!r}{hint}")
        return cls(**kwargs)


def offload_from_env(
    moe_offload: str | float | None = None,
    reserve_gb: float | None = None,
    profile: bool | None = None,
) -> OffloadConfig:
    """The offload settings from these values, each falling back to its variable."""
    return EngineArgs(
        moe_offload=moe_offload, moe_offload_reserve_gb=reserve_gb, moe_offload_profile=profile
    ).offload_config()
