"""Llama (dense: no q/k norms; a qkv bias only where `attention_bias` says). A dense model is
the shared decoder with a gated MLP in every layer (no routed experts), so it never enters
the offload path. llama.cpp's GGUF `llama` files with experts are Mixtral (`mixtral.py`)."""

from __future__ import annotations

from typing import Any

from xinfer.config import ModelConfig
from xinfer.models.hf_config import decoder_fields
from xinfer.models.moe_decoder import MoeForCausalLM


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    return ModelConfig(
        **decoder_fields(hf, architecture),
        num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, norm_topk_prob=False,
        qkv_bias=bool(hf.get("attention_bias", False)),
        hf_config=hf,
    )  # fmt: skip


class LlamaForCausalLM(MoeForCausalLM):
    pass
