"""Tiny random checkpoints of every supported architecture, written by transformers'
`save_pretrained` (per-expert names) or as transformers 5's in-memory fused layout."""

from __future__ import annotations

from pathlib import Path

import torch

# name → (config class, model class, config kwargs)
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

DROP = object()  # an ARCHS value that removes a _COMMON key (a config without that field)
_HYBRID = dict(
    num_hidden_layers=4,
    full_attention_interval=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    num_experts=8,
    num_experts_per_tok=2,
)

ARCHS: dict[str, dict] = {
    # dense layer 1 (mlp_only_layers), q/k norm per head, tied embeddings
    "qwen3_moe": dict(
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        head_dim=16,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        tie_word_embeddings=True,
    ),
    # shared expert + sigmoid gate, qkv bias, sparse step 2 → layer 0 and 2 dense
    "qwen2_moe": dict(
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        shared_expert_intermediate_size=48,
        decoder_sparse_step=2,
        norm_topk_prob=False,
    ),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    # q/k norm over the whole projection; linear RoPE scaling
    "olmoe": dict(
        num_experts=8,
        num_experts_per_tok=2,
        intermediate_size=32,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    ),
    # hybrid: Gated DeltaNet layers 0, 2 and gated full attention 1, 3 (partial rotary);
    # shared expert; layer 2 dense (Qwen3-Next only)
    "qwen3_next": dict(_HYBRID, mlp_only_layers=[2]),
    "qwen3_5_moe": dict(_HYBRID, intermediate_size=DROP),
}


def hf_classes(model_type: str):
    import transformers as tf

    return {
        "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
        "qwen2_moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM),
        "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM),
        "olmoe": (tf.OlmoeConfig, tf.OlmoeForCausalLM),
        "qwen3_next": (tf.Qwen3NextConfig, tf.Qwen3NextForCausalLM),
        "qwen3_5_moe": (tf.Qwen3_5MoeTextConfig, tf.Qwen3_5MoeForCausalLM),
    }[model_type]


def hf_config_kwargs(model_type: str, **overrides) -> dict:
    kw = {**_COMMON, **ARCHS[model_type], **overrides}
    return {k: v for k, v in kw.items() if v is not DROP}


def make_hf_model(model_type: str, seed: int = 0, **overrides):
    cfg_cls, model_cls = hf_classes(model_type)
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**hf_config_kwargs(model_type, **overrides))).eval()
    if "linear_num_key_heads" in ARCHS[model_type]:
        _perturb_hybrid_inits(model)
    return model


@torch.no_grad()
def _perturb_hybrid_inits(model) -> None:
    """Hybrid models initialise their (1 + w) norm weights to zero, the gated norm to ones
    and dt_bias to ones; random values make the tests see whether each is applied."""
    for name, p in model.named_parameters():
        if name.endswith(("norm.weight", "dt_bias")):
            p.add_(torch.randn_like(p) * 0.2)


def write_checkpoint(model, path: Path, layout: str = "per_expert") -> Path:
    """`per_expert`: save_pretrained; `fused`: the in-memory state dict (gate_up_proj)."""
    path.mkdir(parents=True, exist_ok=True)
    if layout == "per_expert":
        model.save_pretrained(path)
        return path
    from safetensors.torch import save_file

    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(path)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def prompts(n: int = 3, seed: int = 0, vocab: int = 256) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = [5, 17, 9, 30, 2, 12][:n]
    return [torch.randint(0, vocab, (ln,), generator=g).tolist() for ln in lens]
