"""Qwen3 (dense, q/k RMSNorm per head). A dense model is the shared decoder with a gated MLP in every layer
(no routed experts), so it never enters the offload path."""

from __future__ import annotations

from xinfer.models.moe_decoder import MoeForCausalLM


class Qwen3ForCausalLM(MoeForCausalLM):
    pass
