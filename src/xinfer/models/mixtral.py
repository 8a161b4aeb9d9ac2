"""Mixtral (block_sparse_moe.experts.N.w1/w2/w3 checkpoint names, always-renormalised top-k).
Config differences live in `ModelConfig.from_hf`; this class states its checkpoint names."""

from __future__ import annotations

from xinfer.models.moe_decoder import MoeForCausalLM


class MixtralForCausalLM(MoeForCausalLM):
    # Mixtral's checkpoints name the MoE block and the expert projections differently.
    checkpoint_renames = (
        ("block_sparse_moe.", "mlp."),
        ("experts.{e}.w1.", "experts.{e}.gate_proj."),
        ("experts.{e}.w3.", "experts.{e}.up_proj."),
        ("experts.{e}.w2.", "experts.{e}.down_proj."),
    )
