"""Tiny random dense checkpoints (llama, qwen2, qwen3, gemma3) from transformers, for the
parity tests of the dense model files, from HF directories and from GGUF files; and the
greedy comparison with transformers' `generate` that names the first difference."""

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


# The tiny Gemma 3's prompts past its window (8): 30 and 12 tokens (GPU and interpreter tests).
GEMMA3_WINDOW_PROMPTS = [list(range(3, 33)), list(range(40, 52))]
# Two float32 stacks (kernels, summation orders) agree on these tiny models' logits to ~1e-5
# (ours vs transformers on CPU: 1e-6; float32 vs float64: 3e-6); a pick whose reference
# margin is below this is a near tie that such noise may flip (the tiny Gemma 3's smallest
# margin on GEMMA3_WINDOW_PROMPTS is 3.7e-3, so there every token must still agree).
TIE_MARGIN = 1e-3


def greedy_mismatch(tokens, logprobs, ref_tokens, ref_logits) -> str | None:
    """Why our greedy `tokens` (with their `logprobs`) are not transformers' `ref_tokens`
    (`ref_logits`: its (V,) logits at each step), in one short line; None when they agree.
    Every token must be the reference's, and its logprob within 1e-4 (relative beyond 1) of
    the reference's, up to a token where ours and the reference's are within TIE_MARGIN of
    each other in the reference's logits: from such a near tie on, the continuations may
    differ. The line names the first difference, both tokens and the reference margin."""
    if len(tokens) != len(ref_tokens):
        return f"{len(tokens)} tokens, transformers {len(ref_tokens)}"
    for pos, (got, want) in enumerate(zip(tokens, ref_tokens)):
        logits = ref_logits[pos].double()
        if got != want:
            margin = (logits[want] - logits[got]).item()
            if margin < TIE_MARGIN:
                return None  # a near tie: float32 noise picks either
            return f"token {pos}: ours {got}, transformers {want}, its logit margin {margin:.2e}"
        ref = torch.log_softmax(logits, -1)[got].item()
        if abs(logprobs[pos] - ref) >= 1e-4 * max(1.0, abs(ref)):
            return f"token {pos} ({got}): logprob {logprobs[pos]:.6f}, transformers {ref:.6f}"
    return None


def assert_greedy_matches(llm, hf, prompts, max_tokens: int) -> None:
    """`llm`'s greedy tokens (and their logprobs) are `hf.generate`'s on hf's device, as
    `greedy_mismatch` says; a failure names the prompt and the first difference."""
    from xinfer import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=0)
    for i, (prompt, res) in enumerate(zip(prompts, llm.generate(prompts, params))):
        ref = hf.generate(
            torch.tensor([prompt], device=hf.device), max_new_tokens=max_tokens, do_sample=False,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
        ref_tokens = ref.sequences[0, len(prompt) :].tolist()
        ref_logits = [step[0].float().cpu() for step in ref.logits]
        logprobs = [lp.logprob for lp in res.logprobs]
        why = greedy_mismatch(res.token_ids, logprobs, ref_tokens, ref_logits)
        assert why is None, f"prompt {i} ({len(prompt)} tokens): {why}"
