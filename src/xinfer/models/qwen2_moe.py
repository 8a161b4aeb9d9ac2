"""Qwen2-MoE / Qwen1.5-MoE (qkv bias, a shared expert behind a sigmoid gate).
The differences from the shared decoder live in `ModelConfig.from_hf` and the checkpoint
name mapping (`xinfer.weights.mapping`), so this class only names the architecture."""

from __future__ import annotations

from xinfer.models.moe_decoder import MoeForCausalLM


class Qwen2MoeForCausalLM(MoeForCausalLM):
    pass
