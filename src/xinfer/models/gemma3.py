"""Gemma 3 (text): sliding-window (local) and global attention layers with their own RoPE
tables, four (1 + w) RMSNorms per layer plus per-head q/k norms, embeddings scaled by
sqrt(hidden), a gelu-tanh gated MLP and an optional final logit soft-cap. The Gemma-only
config keys are read here from the HF config (or the GGUF-derived one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xinfer import kernels
from xinfer.config import ModelConfig, RopeConfig
from xinfer.errors import UserError
from xinfer.layers.attention import PagedAttention
from xinfer.layers.linear import Linear, MergedLinear
from xinfer.layers.mlp import GatedMLP
from xinfer.layers.norm import RMSNorm
from xinfer.layers.rotary import RotaryEmbedding
from xinfer.models.hf_config import decoder_fields
from xinfer.models.moe_decoder import MoeForCausalLM

_SLIDING, _FULL = "sliding_attention", "full_attention"


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    fields = decoder_fields(hf, architecture)
    fields["hidden_act"] = (
        hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    )
    if fields["hidden_act"] != "gelu_pytorch_tanh":
        raise UserError(f"Gemma 3 with activation {fields['hidden_act']!r} is not supported")
    return ModelConfig(
        **fields,
        num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, norm_topk_prob=False,
        qkv_bias=bool(hf.get("attention_bias", False)),
        qk_norm="head",
        hf_config=hf,
    )  # fmt: skip


@dataclass(frozen=True)
class Gemma3Extras:
    """What Gemma 3 adds to the shared ModelConfig."""

    layer_types: tuple[str, ...]
    sliding_window: int
    query_pre_attn_scalar: float
    rope_global: RopeConfig
    rope_local: RopeConfig
    final_logit_softcapping: float | None

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> Gemma3Extras:
        hf = cfg.hf_config
        if hf.get("attn_logit_softcapping") is not None:
            raise UserError("Gemma attention logit soft-capping is not supported (Gemma 2 only)")
        pattern = hf.get("sliding_window_pattern") or 6
        types = hf.get("layer_types") or [
            _SLIDING if (i + 1) % pattern else _FULL for i in range(cfg.num_layers)
        ]
        params = hf.get("rope_parameters") or {}
        if _FULL in params:  # transformers 5: one RoPE dict per layer type
            rope_global = RopeConfig.from_hf({"rope_parameters": params[_FULL]})
            rope_local = RopeConfig.from_hf({"rope_parameters": params[_SLIDING]})
        else:  # older configs and GGUF: rope_theta (+ rope_scaling) global, a local base
            rope_global = cfg.rope
            rope_local = RopeConfig(theta=float(hf.get("rope_local_base_freq", 10000.0)))
        return cls(
            layer_types=tuple(types),
            sliding_window=int(hf.get("sliding_window") or 4096),
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar") or cfg.head_dim),
            rope_global=rope_global,
            rope_local=rope_local,
            final_logit_softcapping=hf.get("final_logit_softcapping"),
        )


class GemmaRMSNorm(RMSNorm):
    """RMSNorm scaling by (1 + w): the checkpoint holds w, the offset is added in float32
    as transformers does (bit-identical in float32)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__(size, eps)
        nn.init.zeros_(self.weight)

    @property
    def scale(self) -> torch.Tensor:
        return (1.0 + self.weight.float()).to(self.weight.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return kernels.rms_norm(x, self.scale, self.eps, residual)


@dataclass(frozen=True)
class _HeadNorm:
    """What `prepare_qkv` reads of a norm: its weight and eps."""

    weight: torch.Tensor
    eps: float


class Gemma3Attention(nn.Module):
    tp_plan = {"qkv_proj": "column", "o_proj": "row"}  # tensor parallel: heads split
    tp_output = "partial"

    def __init__(self, cfg: ModelConfig, extras: Gemma3Extras, rotary: RotaryEmbedding,
                 is_sliding: bool) -> None:  # fmt: skip
        super().__init__()
        hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        self.q_size, self.kv_size, self.head_dim = nh * hd, nkv * hd, hd
        self.qkv_proj = MergedLinear(
            cfg.hidden_size, {"q": nh * hd, "k": nkv * hd, "v": nkv * hd}, bias=cfg.qkv_bias
        )
        self.o_proj = Linear(nh * hd, cfg.hidden_size)
        self.q_norm, self.k_norm = (
            GemmaRMSNorm(hd, cfg.rms_norm_eps),
            GemmaRMSNorm(hd, cfg.rms_norm_eps),
        )
        self.rotary = rotary  # shared by all layers of this kind
        window = extras.sliding_window if is_sliding else None
        scale = extras.query_pre_attn_scalar**-0.5
        self.attn = PagedAttention(nh, nkv, hd, scale, sliding_window=window)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(q.shape[0], -1, self.head_dim)  # (T, Hq, D)
        k = k.reshape(k.shape[0], -1, self.head_dim)  # (T, Hk, D)
        v = v.reshape(v.shape[0], -1, self.head_dim)
        eps = self.q_norm.eps
        norms = (_HeadNorm(self.q_norm.scale, eps), _HeadNorm(self.k_norm.scale, eps))
        q = self.attn.prepare_qkv(positions, q, k, v, self.rotary.cos_sin_cache, *norms)
        return self.o_proj(self.attn(q))


class GeluGatedMLP(GatedMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, extras: Gemma3Extras, rotary: RotaryEmbedding,
                 is_sliding: bool) -> None:  # fmt: skip
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Gemma3Attention(cfg, extras, rotary, is_sliding)
        self.mlp = GeluGatedMLP(h, cfg.intermediate_size)
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = self.self_attn(positions, self.input_layernorm(x))
        h, residual = self.pre_feedforward_layernorm(self.post_attention_layernorm(h), x)
        h = self.post_feedforward_layernorm(self.mlp(h))
        return residual + h


class Gemma3Model(nn.Module):
    def __init__(self, cfg: ModelConfig, extras: Gemma3Extras, max_pos: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # sqrt(hidden) as a float32 buffer on the model's device, rounded to the activation
        # dtype in forward (transformers' bits); not a torch.tensor built in forward, whose
        # host-to-device copy a CUDA graph capture refuses
        scale = torch.tensor(cfg.hidden_size**0.5, dtype=torch.float32)
        self.embed_scale = nn.Buffer(scale, persistent=False)
        rotary = {
            True: RotaryEmbedding(cfg.head_dim, extras.rope_local, max_pos),
            False: RotaryEmbedding(cfg.head_dim, extras.rope_global, max_pos),
        }
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(cfg, extras, rotary[kind == _SLIDING], kind == _SLIDING)
            for kind in extras.layer_types
        )
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        x = x * self.embed_scale.to(x.dtype)
        for layer in self.layers:
            x = layer(positions, x)
        return self.norm(x)


class Gemma3ForCausalLM(MoeForCausalLM):
    """Dense: no routed experts, never offloaded."""

    def __init__(
        self, cfg: ModelConfig, max_pos: int, expert_device: torch.device | None = None
    ) -> None:
        nn.Module.__init__(self)  # the shared decoder's layers are not Gemma's
        self.config = cfg
        self.extras = Gemma3Extras.from_config(cfg)
        if cfg.num_layers != len(self.extras.layer_types):
            raise UserError("Gemma 3 config: layer_types must name every layer")
        self.model = Gemma3Model(cfg, self.extras, max_pos)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Linear(cfg.hidden_size, cfg.vocab_size, quantizable=False)
        )

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.extras.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
