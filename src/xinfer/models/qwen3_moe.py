"""Qwen3-MoE (q/k norms per head, no qkv bias).
The differences from the shared decoder live in `ModelConfig.from_hf` and the checkpoint
name mapping (`xinfer.weights.mapping`), so this class only names the architecture."""

from __future__ import annotations

from xinfer.models.moe_decoder import MoeForCausalLM


class Qwen3MoeForCausalLM(MoeForCausalLM):
    pass
