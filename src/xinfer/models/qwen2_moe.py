"""Qwen2-MoE / Qwen1.5-MoE: the shared MoE decoder with a qkv bias (on unless the config says
otherwise) and a shared expert behind a sigmoid gate."""

from __future__ import annotations

from typing import Any

from xinfer.config import ModelConfig
from xinfer.models.hf_config import decoder_fields, moe_fields
from xinfer.models.moe_decoder import MoeForCausalLM


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    return ModelConfig(
        **decoder_fields(hf, architecture),
        **moe_fields(hf),
        qkv_bias=bool(hf.get("qkv_bias", hf.get("attention_bias", True))),
        hf_config=hf,
    )


class Qwen2MoeForCausalLM(MoeForCausalLM):
    pass
