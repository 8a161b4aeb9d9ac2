"""Qwen3-MoE: the shared MoE decoder with q/k RMSNorm per head and no qkv bias; dense layers
where `mlp_only_layers` / `decoder_sparse_step` say."""

from __future__ import annotations

from typing import Any

from xinfer.config import ModelConfig
from xinfer.models.hf_config import decoder_fields, moe_fields
from xinfer.models.moe_decoder import MoeForCausalLM


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    return ModelConfig(
        **decoder_fields(hf, architecture),
        **moe_fields(hf),
        qkv_bias=bool(hf.get("attention_bias", False)),
        qk_norm="head",
        hf_config=hf,
    )


class Qwen3MoeForCausalLM(MoeForCausalLM):
    pass
