"""Tiny random dense checkpoints (llama, qwen2, qwen3, gemma3) from transformers, for the
parity tests of the dense model files, from HF directories and from GGUF files."""

from __future__ import annotations

import torch

_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
DENSE: dict[str, dict] = {
    "llama": dict(tie_word_embeddings=False),
    "qwen2": dict(tie_word_embeddings=False),
    "qwen3": dict(head_dim=16, tie_word_embeddings=True),
    # 6 layers: the 6th is global (pattern 6, as GGUF implies); window 8 < the prompts
    "gemma3_text": dict(
        num_hidden_layers=6, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
        final_logit_softcapping=30.0,
    ),
}  # fmt: skip


def make_dense(model_type: str, seed: int = 0, **overrides):
    import transformers as tf

    cfg_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "gemma3_text": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
    }[model_type]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**{**_COMMON, **DENSE[model_type], **overrides})).eval()
    if model_type == "gemma3_text":  # zero-initialised norms would hide a missing 1 + w
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.normal_(0, 0.3)
    if model_type == "qwen2":  # make the qkv biases matter
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("proj.bias"):
                    p.normal_(0, 0.5)
    return model
