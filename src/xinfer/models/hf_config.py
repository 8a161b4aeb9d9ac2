"""Reading the HF `config.json` fields that every decoder names the same way. Model files
build their `ModelConfig` from these pieces plus their own quirks (`config_from_hf`), so
this module never asks which model it is reading."""

from __future__ import annotations

from typing import Any

from xinfer.config import RopeConfig
from xinfer.errors import UserError

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# Sizes that must be positive integers where given (null: the model's default).
_SIZES = (*_REQUIRED, "num_key_value_heads", "head_dim", "max_position_embeddings")


def require(hf: dict[str, Any], keys: tuple[str, ...] = _REQUIRED) -> None:
    """A UserError naming the first missing key or the first size that is no positive
    integer (not a KeyError or TypeError from deep inside)."""
    for key in keys:
        if key not in hf:
            raise UserError(f"config.json lacks {key!r}; is this a causal LM config?")
    for key in _SIZES:
        value = hf.get(key)
        if value is not None and (type(value) is not int or value < 1):
            raise UserError(f"config.json's {key} must be a positive integer, got {value!r}")


def eos_token_ids(hf: dict[str, Any]) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))


def decoder_fields(hf: dict[str, Any], architecture: str) -> dict[str, Any]:
    """`ModelConfig` keyword arguments common to HF decoder configs: sizes, heads, norm eps,
    RoPE, context length, embeddings tying, activation, dtype and special tokens."""
    require(hf)
    num_heads = hf["num_attention_heads"]
    return dict(
        architecture=architecture,
        model_type=hf.get("model_type", ""),
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
        intermediate_size=hf.get("intermediate_size", 0) or 0,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope=RopeConfig.from_hf(hf),
        max_position_embeddings=hf.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        hidden_act=hf.get("hidden_act", "silu"),
        torch_dtype=str(hf.get("dtype") or hf.get("torch_dtype") or "float32"),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_token_ids(hf),
    )


def moe_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """The Qwen-style MoE keys (`num_experts`, `moe_intermediate_size`, a shared expert,
    `mlp_only_layers` / `decoder_sparse_step`); a model that names them differently
    overrides the result."""
    return dict(
        num_experts=hf.get("num_experts") or hf.get("num_local_experts") or 0,
        num_experts_per_tok=hf.get("num_experts_per_tok", 0),
        moe_intermediate_size=hf.get("moe_intermediate_size") or 0,
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=hf.get("shared_expert_intermediate_size", 0) or 0,
        mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
        decoder_sparse_step=hf.get("decoder_sparse_step", 1) or 1,
    )
