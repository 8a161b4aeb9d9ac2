"""Llama (dense: no qkv bias, no q/k norms; also Mistral-style configs). A dense model is the shared decoder with a gated MLP in every layer
(no routed experts), so it never enters the offload path."""

from __future__ import annotations

from xinfer.models.moe_decoder import MoeForCausalLM


class LlamaForCausalLM(MoeForCausalLM):
    pass
