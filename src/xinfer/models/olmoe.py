"""OLMoE: the shared MoE decoder with q/k RMSNorm over the whole projection (not per head)
and an optional `clip_qkv`."""

from __future__ import annotations

from typing import Any

from xinfer.config import ModelConfig
from xinfer.models.hf_config import decoder_fields, moe_fields
from xinfer.models.moe_decoder import MoeForCausalLM


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    fields = {**decoder_fields(hf, architecture), **moe_fields(hf)}
    # OLMoE's experts use `intermediate_size`; it has no dense layers.
    fields["moe_intermediate_size"] = fields["moe_intermediate_size"] or fields["intermediate_size"]
    return ModelConfig(
        **fields,
        qkv_bias=bool(hf.get("attention_bias", False)),
        qk_norm="full",
        clip_qkv=hf.get("clip_qkv"),
        hf_config=hf,
    )


class OlmoeForCausalLM(MoeForCausalLM):
    pass
