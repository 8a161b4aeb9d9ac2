"""OLMoE (q/k norms over the whole projection, optional clip_qkv).
The differences from the shared decoder live in `ModelConfig.from_hf` and the checkpoint
name mapping (`xinfer.weights.mapping`), so this class only names the architecture."""

from __future__ import annotations

from xinfer.models.moe_decoder import MoeForCausalLM


class OlmoeForCausalLM(MoeForCausalLM):
    pass
