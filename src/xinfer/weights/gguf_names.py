"""GGUF tensor names → the HF checkpoint names our models load (`blk.3.attn_q.weight` →
`model.layers.3.self_attn.q_proj.weight`), and the two layout changes llama.cpp's converter
made that must be undone: llama's q/k rows permuted for interleaved RoPE, and Gemma's norm
weights stored as 1 + w. Stacked expert tensors `ffn_*_exps` (E, rows, K) map per expert."""

from __future__ import annotations

import re

import torch

_LAYER = re.compile(r"^blk\.(?P<layer>\d+)\.(?P<name>\w+)\.(?P<kind>weight|bias)$")
_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_IN_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# Gemma 3 has four norms per layer; GGUF's ffn_norm is its pre-feed-forward norm.
_GEMMA3 = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
# GGUF weights of the engine's linear layers (the others are embeddings, norms and routers)
_LINEAR = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
    "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
}  # fmt: skip


def hf_name(gguf_name: str, arch: str) -> str | None:
    """The HF name of a non-expert tensor; None for expert stacks and unknown names."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    m = _LAYER.match(gguf_name)
    if not m:
        return None
    table = {**_IN_LAYER, **_GEMMA3} if arch == "gemma3" else _IN_LAYER
    if m["name"] not in table:
        return None
    return f"model.layers.{m['layer']}.{table[m['name']]}.{m['kind']}"


def is_linear_weight(gguf_name: str) -> bool:
    """A weight that a linear layer multiplies by (the LM head included)."""
    if gguf_name == "output.weight":
        return True
    m = _LAYER.match(gguf_name)
    return bool(m) and m["kind"] == "weight" and m["name"] in _LINEAR


def expert_names(gguf_name: str, num_experts: int) -> list[str] | None:
    """HF names of the per-expert slices of a stacked `ffn_*_exps` tensor, else None."""
    m = _LAYER.match(gguf_name)
    if not m or m["name"] not in _EXPERTS:
        return None
    proj = _EXPERTS[m["name"]]
    return [f"model.layers.{m['layer']}.mlp.experts.{e}.{proj}.weight" for e in range(num_experts)]


def unpermute_order(num_rows: int, num_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation: index a GGUF q (or k) weight's
    rows with it (values or raw block bytes alike: rows stay whole) to get HF's rows."""
    half = num_rows // num_heads // 2
    # GGUF row (h, j, i) holds HF row (h, i, j), i in {0, 1}, j < half
    return torch.arange(num_rows).view(num_heads, half, 2).transpose(1, 2).reshape(-1)


def needs_unpermute(arch: str) -> bool:
    return arch == "llama"


def is_offset_norm(arch: str, gguf_name: str) -> bool:
    """Gemma stores norm weights as 1 + w; the HF model (and ours) add the 1 at run time."""
    return arch == "gemma3" and gguf_name.endswith("norm.weight")
