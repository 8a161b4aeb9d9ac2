"""Frozen configuration dataclasses: the model's shape (normalised across HF config styles),
the cache, offload and parallel settings, and the engine config that bundles them.
`auto` values are turned into numbers once, with `dataclasses.replace`, by the engine."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from xinfer.errors import UserError
from xinfer.kv.format import KVDtype, TurboQuant, kv_bytes_per_head
from xinfer.parallel.devices import ParallelConfig
from xinfer.routing.config import RoutingConfig

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def parse_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    """`None`/"auto" → None (use the checkpoint's), a name → torch dtype, else a UserError."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if value == "auto":
        return None
    if value not in _DTYPES:
        raise UserError(f"unknown dtype {value!r}; use one of auto, float32, bfloat16, float16")
    return _DTYPES[value]


_KV_DTYPES: dict[str, KVDtype | None] = {
    "auto": None,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp8": torch.float8_e4m3fn,  # half of bf16's bytes; e4m3 without scales, saturating
    "turbo4": TurboQuant(4),  # 4-bit codes of rotated K/V + a scale: ~3.9x fewer than bf16
    "turbo3": TurboQuant(3),  # ~5.1x
}


def parse_kv_dtype(value: str | None) -> KVDtype | None:
    """`--kvcache-dtype`: None/"auto" = the model dtype; bf16, fp16, fp8 (e4m3), or a
    TurboQuant format (turbo4, turbo3; kv/format.py), which is not a torch dtype."""
    if value is None:
        return None
    if value not in _KV_DTYPES:
        raise UserError(
            f"--kvcache-dtype {value!r} is not supported; use auto, bf16, fp16, fp8, turbo4 "
            "or turbo3"
        )
    return _KV_DTYPES[value]


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"  # default | linear | yarn | llama3
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # per-frequency divisors of the inverse frequencies (GGUF's `rope_freqs` tensor, which
    # llama.cpp's converter writes for llama3 scaling); () = none
    freq_factors: tuple[float, ...] = ()

    _SUPPORTED = ("default", "linear", "yarn", "llama3")

    def __post_init__(self) -> None:
        if self.rope_type not in self._SUPPORTED:
            raise UserError(
                f"RoPE type {self.rope_type!r} is not supported; supported: "
                + ", ".join(self._SUPPORTED)
            )

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> RopeConfig:
        # transformers 5 writes `rope_parameters`; older configs `rope_theta` + `rope_scaling`.
        params = dict(hf.get("rope_parameters") or {})
        scaling = hf.get("rope_scaling") or {}
        params = {**scaling, **params}
        theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        kw: dict[str, Any] = {"theta": float(theta), "rope_type": rope_type}
        for key in (
            "factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "low_freq_factor",
            "high_freq_factor",
        ):
            if params.get(key) is not None:
                kw[key] = params[key]
        if params.get("freq_factors"):
            kw["freq_factors"] = tuple(float(f) for f in params["freq_factors"])
        return cls(**kw)


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder as the engine's shared code reads it, whichever HF (or GGUF)
    config described it. Each model file builds it (`config_from_hf` in `xinfer.models.*`),
    so architecture quirks live there; a family that needs fields of its own subclasses this
    (see `models/hybrid_decoder.py`) and overrides the cache-sizing methods below."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    intermediate_size: int = 0  # dense MLP layers
    num_experts: int = 0  # routed experts; 0 = a dense model
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: str | None = None  # None | "head" (per head, Qwen3) | "full" (whole projection, OLMoE)
    clip_qkv: float | None = None
    shared_expert_intermediate_size: int = 0
    mlp_only_layers: tuple[int, ...] = ()
    decoder_sparse_step: int = 1
    hidden_act: str = "silu"
    torch_dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    hf_config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.hidden_act not in ("silu", "swiglu", "gelu_pytorch_tanh"):
            raise UserError(
                f"activation {self.hidden_act!r} is not supported (silu, gelu_pytorch_tanh)"
            )
        if self.num_heads % self.num_kv_heads:
            raise UserError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer_idx: int) -> bool:
        return (
            self.is_moe
            and layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    @property
    def moe_layer_ids(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_moe_layer(i)]

    @property
    def kv_layer_ids(self) -> list[int]:
        """Layers that keep a paged KV cache (all of them, unless a subclass says otherwise)."""
        return list(range(self.num_layers))

    def expert_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of one routed expert (gate, up and down projections)."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 3 * self.hidden_size * self.moe_intermediate_size * elem

    def kv_bytes_per_token(self, dtype: KVDtype) -> int:
        """K and V of every KV layer; a TurboQuant format counts its codes and scales."""
        per_head = kv_bytes_per_head(dtype, self.head_dim)
        return 2 * len(self.kv_layer_ids) * self.num_kv_heads * per_head

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        """Bytes of per-request recurrent state (linear-attention layers); 0 for a model
        whose only cache is the paged KV cache."""
        return 0

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Normalise an HF `config.json` dict through the model file that owns its
        architecture (`xinfer.models.registry`)."""
        from xinfer.models.registry import config_from_hf

        return config_from_hf(hf)

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> ModelConfig:
        p = Path(path)
        if not p.exists():
            raise UserError(f"model path {str(p)!r} does not exist")
        if p.is_file() and p.suffix.lower() == ".gguf":
            from xinfer.weights.gguf_config import hf_config_from_gguf
            from xinfer.weights.gguf_loader import cached_gguf

            return cls.from_hf(hf_config_from_gguf(cached_gguf(str(p))))
        if not p.is_dir():
            raise UserError(f"model path {str(p)!r} is not a directory with a config.json")
        cfg = p / "config.json"
        if not cfg.exists():
            gguf = sorted(p.glob("*.gguf"))
            fix = (
                f"pass the GGUF file itself: --m {gguf[0]}"
                if gguf
                else "point --m at an HF model directory"
            )
            raise UserError(f"{str(p)!r} has no config.json; {fix}")
        try:
            hf = json.loads(cfg.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{cfg} is not valid JSON ({e})") from None
        if not isinstance(hf, dict):
            raise UserError(f"{cfg} must hold a JSON object, not a {type(hf).__name__}")
        return cls.from_hf(hf)


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_blocks: int | None = None  # None = sized by the engine from free memory
    kv_dtype: KVDtype | None = None  # None = model dtype; a torch dtype or TurboQuant
    gpu_memory_utilization: float = 0.90

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise UserError("block size must be a positive power of two")
        if not 0.05 <= self.gpu_memory_utilization <= 1.0:
            raise UserError("gpu memory utilization must be in [0.05, 1.0]")


MAX_PREFETCH_DISTANCE = 4
# Prefetch's distance when the user sets none and experts are offloaded. On the H100
# (2026-12-06, Qwen3-30B-A3B shape, `qwen3-30b-a3b` routing, 16 fill programs, side-stream
# reservation) two layers ahead beat prefetch off on every row measured: batch 1 at 20%
# bf16 1.11x, FP8 1.17x, GPTQ 1.19x, NVFP4 1.24x, bf16 35% 1.16x; batch 8 1.02-1.05x; and
# beat one layer ahead (GPTQ 160.0 vs 151.3 tok/s, NVFP4 159.1 vs 150.7) and three (156.0).
DEFAULT_PREFETCH_DISTANCE = 2
# A guess is kept when its score beats the (k+1)-th by more than this. 0 gained 5% on GPTQ
# experts at 20% (167.8 vs 160.0 tok/s, H100 2026-12-06: the link has slack at 4 bits); not
# measured on link-bound bf16 rows, where its wasted bytes cost in full.
DEFAULT_PREFETCH_MARGIN = 0.5
# How a decode graph moves missed experts host→GPU: `kernel` (SM programs read the mapped host
# store) or `copy-engine` (copy-engine copies chosen on the device by conditional graph nodes,
# offload/copy_engine.py).
OFFLOAD_FILLS = ("kernel", "copy-engine")
# Which expert a miss evicts from a layer's slots (offload/lookup.py): the least recently
# used, or the least frequently used by a decayed count, admitted only if at least as
# frequent as its victim.
OFFLOAD_POLICIES = ("lru", "lfu")
PREFETCH_ISSUE_POINTS = ("after-fill", "before-lookup")
# The prompt pass's stream buffers (offload/slot_pool.py regions): two overlap a layer's copy
# with the previous layer's compute; one gives its E - S rows a layer to the slots instead.
STREAM_BUFFER_CHOICES = ("auto", "1", "2")


def parse_stream_buffers(value: str | int | None) -> int | None:
    """`--moe-offload-stream-buffers`: "auto" (or None) → None (offload/sizing.py decides),
    1 or 2 (as a number or a string) → that count, anything else a UserError."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    text = str(value).strip() if not isinstance(value, bool) else ""
    if text not in STREAM_BUFFER_CHOICES[1:]:
        raise UserError(f"--moe-offload-stream-buffers must be auto, 1 or 2, got {value!r}")
    return int(text)


@dataclass(frozen=True)
class OffloadConfig:
    """`fraction=None` and `is_auto=False`: no offload."""

    fraction: float | None = None
    is_auto: bool = False
    reserve_gb: float = 2.5
    is_profile: bool = False
    # Cross-layer expert prefetch (offload/prefetch.py): predict the experts of the MoE layer
    # this many layers ahead (0 = off; None = DEFAULT_PREFETCH_DISTANCE when experts are
    # offloaded and the model has a predictor, see `prefetch_layers`) and keep a guess only
    # when its score beats the (k+1)-th by more than the margin.
    prefetch_distance: int | None = None
    prefetch_margin: float | None = None  # None: DEFAULT_PREFETCH_MARGIN (`prefetch_cut`)
    fill: str = "kernel"  # one of OFFLOAD_FILLS
    # How the prefetch copies move (None: as `fill`). HBM-bound kernels beside the fill
    # kernel ran ~11x slower on the H200; copy-engine copies use no SM.
    prefetch_fill: str | None = None
    # The prefetch fill kernel's programs (None: 16 in all, 64 with packed experts,
    # offload/prefetch.default_fill_programs) and where layer l issues the prefetch of l + d
    # (offload/prefetch.py); decisions and output are the same either way.
    prefetch_programs: int | None = None
    prefetch_issue: str = "after-fill"  # one of PREFETCH_ISSUE_POINTS
    # One of OFFLOAD_POLICIES. `lfu` by default since the H100 measured it (2026-12-05, the
    # Qwen3 routing preset): batch 1 at 10% +13% tok/s, batch 8 at 35% +14.5%, no loss.
    policy: str = "lfu"
    # Keep bf16 experts packed in the host store (offload/packed.py): 12 bits an element
    # cross the link on a miss, unpacked bit for bit by the fill kernel.
    compress: bool = False
    # The prompt pass's stream buffers (slot_pool.py regions): 1 or 2; None = chosen with
    # the slots (offload/sizing.py `plan_slots`: one where it buys a fifth more slots).
    stream_buffers: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in OFFLOAD_POLICIES:
            raise UserError(
                f"MoE offload policy must be one of {', '.join(OFFLOAD_POLICIES)}, "
                f"got {self.policy!r}"
            )
        if self.is_profile and not self.is_auto and self.fraction is None:
            raise UserError(
                "--moe-offload-profile times the offloaded MoE calls: it needs MoE expert "
                "offload (--moe-offload or XINFER_MOE_OFFLOAD)"
            )
        if self.compress and not self.is_auto and self.fraction is None:
            raise UserError(
                "--moe-offload-compress packs the offloaded experts: it needs MoE expert "
                "offload (--moe-offload or XINFER_MOE_OFFLOAD)"
            )
        if self.compress and "copy-engine" in (self.fill, self.prefetch_fill):
            raise UserError(
                "--moe-offload-compress needs the fill kernel to unpack the experts: the copy "
                "engine only copies bytes; use --moe-offload-fill kernel"
            )
        for what, value in (("fill", self.fill), ("prefetch fill", self.prefetch_fill)):
            if value is not None and value not in OFFLOAD_FILLS:
                raise UserError(
                    f"MoE offload {what} must be one of {', '.join(OFFLOAD_FILLS)}, got {value!r}"
                )
        if self.prefetch_fill is not None and not self.prefetch_layers:
            raise UserError(
                "--moe-prefetch-fill says how prefetch copies move: it needs prefetch "
                "(--moe-prefetch other than 0) and MoE expert offload"
            )
        if self.fill != "kernel" and self.fraction is None and not self.is_auto:
            raise UserError(
                f"--moe-offload-fill {self.fill} moves offloaded experts: it needs MoE expert "
                "offload (--moe-offload or XINFER_MOE_OFFLOAD); run without it"
            )
        if self.prefetch_distance and self.fraction is None and not self.is_auto:
            raise UserError(
                "--moe-prefetch copies offloaded experts ahead: it needs MoE expert offload "
                "(--moe-offload or XINFER_MOE_OFFLOAD); run without it"
            )
        if self.prefetch_distance is not None and not (
            0 <= self.prefetch_distance <= MAX_PREFETCH_DISTANCE
        ):
            raise UserError(
                f"MoE prefetch distance must be 0 (off) to {MAX_PREFETCH_DISTANCE} layers, "
                f"got {self.prefetch_distance}"
            )
        if self.prefetch_issue not in PREFETCH_ISSUE_POINTS:
            raise UserError(
                f"MoE prefetch issue point must be one of {', '.join(PREFETCH_ISSUE_POINTS)}, "
                f"got {self.prefetch_issue!r}"
            )
        if self.prefetch_programs is not None and self.prefetch_programs < 1:
            raise UserError(f"MoE prefetch programs must be >= 1, got {self.prefetch_programs}")
        tuned = (
            self.prefetch_programs is not None
            or self.prefetch_issue != "after-fill"
            or self.prefetch_margin is not None
        )
        if tuned and not self.prefetch_layers:
            raise UserError(
                "--moe-prefetch-margin, --moe-prefetch-programs and --moe-prefetch-issue tune "
                "prefetching: they need prefetch (--moe-prefetch other than 0) and MoE expert "
                "offload (--moe-offload or XINFER_MOE_OFFLOAD)"
            )
        if self.prefetch_programs is not None and (self.prefetch_fill or self.fill) != "kernel":
            raise UserError(
                "--moe-prefetch-programs sizes the prefetch fill kernel: the copy-engine "
                "prefetch fill has no programs"
            )
        if self.prefetch_margin is not None and not self.prefetch_margin >= 0:
            raise UserError(f"MoE prefetch margin must be >= 0, got {self.prefetch_margin}")
        if self.fraction is not None and not 0.0 < self.fraction <= 1.0:
            raise UserError(
                f"MoE offload fraction must be in (0, 1] or 'auto', got {self.fraction}"
            )
        if self.stream_buffers is not None and self.stream_buffers not in (1, 2):
            raise UserError(
                f"MoE offload stream buffers must be 1 or 2 (None: auto), got "
                f"{self.stream_buffers!r}"
            )
        if self.stream_buffers is not None and not self.is_enabled:
            raise UserError(
                f"--moe-offload-stream-buffers {self.stream_buffers} sizes the prompt pass's "
                "buffers of offloaded experts: it needs MoE expert offload (--moe-offload or "
                "XINFER_MOE_OFFLOAD)"
            )
        if self.reserve_gb < 0:
            raise UserError(f"MoE offload reserve must be >= 0 GB, got {self.reserve_gb}")

    @property
    def is_enabled(self) -> bool:
        return self.is_auto or self.fraction is not None

    @property
    def prefetch_layers(self) -> int:
        """How many layers ahead prefetch runs: the distance given, else (None)
        DEFAULT_PREFETCH_DISTANCE with offload on; 0 = off."""
        if not self.is_enabled:
            return 0
        return (
            DEFAULT_PREFETCH_DISTANCE if self.prefetch_distance is None else self.prefetch_distance
        )

    @property
    def prefetch_cut(self) -> float:
        """The prefetch margin in force: the one given, else DEFAULT_PREFETCH_MARGIN."""
        return DEFAULT_PREFETCH_MARGIN if self.prefetch_margin is None else self.prefetch_margin

    @property
    def prefetch_is_default(self) -> bool:
        """Prefetch is on because nobody set it (a model without a predictor then runs
        without it, where a distance given is refused)."""
        return self.prefetch_distance is None and self.is_enabled

    @classmethod
    def parse(cls, value: str | float | None, **kw: Any) -> OffloadConfig:
        """Parse the user's `XINFER_MOE_OFFLOAD` / `--moe-offload` value."""
        if value is None or value == "":
            return cls(**kw)
        if isinstance(value, str) and value.strip().lower() == "auto":
            return cls(is_auto=True, **kw)
        try:
            frac = float(value)
        except (TypeError, ValueError):
            raise UserError(
                f"MoE offload must be 'auto' or a fraction in (0, 1], got {value!r}"
            ) from None
        return cls(fraction=frac, **kw)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # tokens per step (prefill chunks plus decodes)
    max_waiting: int = 256

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise UserError("--max-num-seqs must be >= 1")
        if self.max_num_batched_tokens < 16:
            raise UserError("--max-num-batched-tokens must be >= 16")


@dataclass(frozen=True)
class EngineConfig:
    model: str
    device: str = "cpu"
    dtype: torch.dtype | None = None
    max_model_len: int | None = None
    allow_long_max_model_len: bool = False  # accept max_model_len above the model's maximum
    load_format: str = "auto"  # auto | dummy
    seed: int = 0
    enforce_eager: bool = False
    # Queue the next greedy decode step before reading this one's tokens (None: on CUDA).
    decode_look_ahead: bool | None = None
    enable_prefix_caching: bool = True  # reuse computed KV blocks of shared prompt prefixes
    log_stats_interval_s: float = 0.0  # seconds between stats lines while busy; 0: never
    gpu_memory_limit_gb: float | None = None
    isq: str | None = None  # quantize the experts at load to this GGUF type (quant/isq.py)
    isq_dense: bool = False  # ...and the dense linear weights
    cache: CacheConfig = field(default_factory=CacheConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Where MoE layers' top-k comes from (benchmarks), and recording of the routed ids.
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # tensor parallelism

    def __post_init__(self) -> None:
        if self.load_format not in ("auto", "dummy"):
            raise UserError(f"--load-format must be 'auto' or 'dummy', got {self.load_format!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise UserError("--max-model-len must be >= 1")
        if self.gpu_memory_limit_gb is not None and self.gpu_memory_limit_gb <= 0:
            raise UserError("--gpu-memory-limit-gb must be > 0")
        if self.isq_dense and self.isq is None:
            raise UserError("--isq-dense needs --isq (the type to quantize to)")
