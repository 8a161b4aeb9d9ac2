"""Mixtral: the shared MoE decoder; experts are `num_local_experts` wide as
`intermediate_size`, top-k always renormalised, and checkpoints name the MoE block and the
expert projections `block_sparse_moe.experts.N.w1/w2/w3`."""

from __future__ import annotations

from typing import Any

from xinfer.config import ModelConfig
from xinfer.models.hf_config import decoder_fields
from xinfer.models.moe_decoder import MoeForCausalLM


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    fields = decoder_fields(hf, architecture)
    return ModelConfig(
        **fields,
        num_experts=hf.get("num_local_experts") or 0,
        num_experts_per_tok=hf.get("num_experts_per_tok", 0),
        moe_intermediate_size=fields["intermediate_size"],
        norm_topk_prob=True,
        qkv_bias=bool(hf.get("attention_bias", False)),
        hf_config=hf,
    )


class MixtralForCausalLM(MoeForCausalLM):
    # Mixtral's checkpoints name the MoE block and the expert projections differently.
    checkpoint_renames = (
        ("block_sparse_moe.", "mlp."),
        ("experts.{e}.w1.", "experts.{e}.gate_proj."),
        ("experts.{e}.w3.", "experts.{e}.up_proj."),
        ("experts.{e}.w2.", "experts.{e}.down_proj."),
    )
