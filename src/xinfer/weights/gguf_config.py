"""GGUF metadata → an HF-style config dict (the keys of a `config.json`), so that a GGUF
model goes through the same `ModelConfig.from_hf` and model files as an HF directory.
The per-architecture facts GGUF does not store (llama.cpp hard-codes them) live here."""

from __future__ import annotations

from typing import Any

import torch

from xinfer.errors import UserError
from xinfer.weights import gguf_names
from xinfer.weights.gguf_file import GGUFCheckpoint

# GGUF `general.architecture` → (HF architecture, HF model_type, fixed HF keys)
_ARCHS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaForCausalLM", "llama", {}),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", {}),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", {}),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe", {"norm_topk_prob": False}),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe", {"norm_topk_prob": True}),
    "olmoe": ("OlmoeForCausalLM", "olmoe", {"norm_topk_prob": False}),
    # llama.cpp: local (sliding) layers use theta 10k, 5 of every 6 layers are local.
    "gemma3": (
        "Gemma3ForCausalLM",
        "gemma3_text",
        {"rope_local_base_freq": 10000.0, "sliding_window_pattern": 6,
         "hidden_activation": "gelu_pytorch_tanh"},
    ),
}  # fmt: skip
_MIXTRAL = ("MixtralForCausalLM", "mixtral", {"norm_topk_prob": True})

# "<arch>.<key>" → HF key
_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.sliding_window": "sliding_window",
    "rope.freq_base": "rope_theta",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
    "expert_weights_norm": "norm_topk_prob",
    "vocab_size": "vocab_size",
}


def supported_gguf_archs() -> list[str]:
    return sorted(_ARCHS)


def _rope_scaling(ckpt: GGUFCheckpoint) -> dict[str, Any] | None:
    kind = ckpt.get("rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {
        "rope_type": kind,
        "factor": float(ckpt.get("rope.scaling.factor", 1.0)),
    }
    if (orig := ckpt.get("rope.scaling.original_context_length")) is not None:
        scaling["original_max_position_embeddings"] = int(orig)
    return scaling


def hf_config_from_gguf(ckpt: GGUFCheckpoint) -> dict[str, Any]:
    arch = ckpt.arch
    if arch not in _ARCHS:
        raise UserError(
            f"GGUF architecture {arch!r} is not supported; supported: "
            + ", ".join(supported_gguf_archs())
        )
    entry = _ARCHS[arch]
    if arch == "llama" and ckpt.get("expert_count", 0):
        entry = _MIXTRAL  # llama.cpp writes Mixtral as llama with experts
    architecture, model_type, fixed = entry
    hf: dict[str, Any] = {"architectures": [architecture], "model_type": model_type, **fixed}
    for key, hf_key in _KEYS.items():
        if (value := ckpt.get(key)) is not None:
            hf[hf_key] = value
    if "num_experts" in hf and model_type == "mixtral":
        hf["num_local_experts"] = hf.pop("num_experts")
    tokens = ckpt.metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in hf:
        if "token_embd.weight" not in ckpt.tensors:
            raise UserError("the GGUF file has no token_embd.weight; it is not a complete model")
        hf["vocab_size"] = ckpt.tensors["token_embd.weight"].shape[0]
    elif tokens is not None and len(tokens) > hf["vocab_size"]:
        raise UserError("the GGUF file's vocabulary is larger than its vocab_size")
    if (scaling := _rope_scaling(ckpt)) is not None:
        hf["rope_scaling"] = scaling
    if (freqs := ckpt.tensors.get("rope_freqs.weight")) is not None:
        factors = freqs.raw.reshape(-1).view(torch.float32) if freqs.btype.name == "F32" else None
        if factors is None:
            raise UserError(f"rope_freqs.weight is {freqs.btype.name}; llama.cpp writes it F32")
        hf["rope_scaling"] = {"rope_type": "default", **(scaling or {})}
        hf["rope_scaling"]["freq_factors"] = factors.tolist()
    if model_type == "gemma3_text":
        hf["query_pre_attn_scalar"] = hf.get("head_dim", 256)
    names = ckpt.tensors
    hf["tie_word_embeddings"] = "output.weight" not in names
    hf["attention_bias"] = "blk.0.attn_q.bias" in names
    hf["dtype"] = "auto"  # quantized weights: run in the engine's default dtype
    if _has_quantized_weights(ckpt):  # the layers' formats follow its block types
        hf["quantization_config"] = {"quant_method": "gguf", "path": str(ckpt.paths[0])}
    meta = ckpt.metadata
    if (bos := meta.get("tokenizer.ggml.bos_token_id")) is not None:
        hf["bos_token_id"] = int(bos)
    eos = [meta.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
    eos_ids = list(dict.fromkeys(int(e) for e in eos if e is not None))
    if eos_ids:
        hf["eos_token_id"] = eos_ids
    return hf


def _has_quantized_weights(ckpt: GGUFCheckpoint) -> bool:
    """Whether a linear or expert weight is stored in a quantized block type (a float file
    is a float checkpoint: `--isq` may quantize it)."""
    return any(
        not t.btype.is_float
        and (gguf_names.is_linear_weight(t.name) or gguf_names.expert_names(t.name, 1))
        for t in ckpt.tensors.values()
    )
