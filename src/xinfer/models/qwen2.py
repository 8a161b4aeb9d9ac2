"""Qwen2 (dense, with a qkv bias). A dense model is the shared decoder with a gated MLP in
every layer (no routed experts), so it never enters the offload path."""

from __future__ import annotations

from typing import Any

from xinfer.config import ModelConfig
from xinfer.models.hf_config import decoder_fields
from xinfer.models.moe_decoder import MoeForCausalLM


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    return ModelConfig(
        **decoder_fields(hf, architecture),
        num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, norm_topk_prob=False,
        qkv_bias=bool(hf.get("attention_bias", True)),
        hf_config=hf,
    )  # fmt: skip


class Qwen2ForCausalLM(MoeForCausalLM):
    pass
