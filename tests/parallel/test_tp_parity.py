"""Tensor parallel over 2 CPU ranks (gloo) against one rank, float32, on the tiny
checkpoint of every architecture (both checkpoint layouts; KV heads fewer than ranks):
greedy tokens equal, and the sampled tokens' logprobs within 1e-4.

Why a tolerance at all: the row-parallel projections (o_proj, down, the experts' down
projection) sum two half-length dot products and then add them across the ranks, where one
rank sums the whole length at once; float32 rounding differs in the last bits (~1e-6
relative), which no greedy choice here is close enough to flip."""

from __future__ import annotations

import pytest
import tiny_models as tm
from tp_checkpoints import checkpoint

from xinfer import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
PROMPTS = tm.prompts(3, seed=11)

# every architecture's tiny checkpoint, plus layouts and shapes that split differently
CASES = {arch: (arch, "per_expert", {}) for arch in tm.ARCHS} | {
    "qwen3_moe-fused": ("qwen3_moe", "fused", {}),  # [E, 2I, H]: gate and up split per half
    "olmoe-kv1": ("olmoe", "fused", {"num_key_value_heads": 1}),  # one KV head on both ranks
    "llama": ("llama", "per_expert", {}),  # dense, untied: vocabulary-parallel LM head
    "gemma3_text": ("gemma3_text", "per_expert", {}),  # its own attention, softcapped logits
}
# qwen3_moe: tied embeddings (logits on every rank); qwen2_moe: shared expert, qkv bias,
# dense layers; olmoe: q/k norm over all heads (all-reduced statistics); qwen3_next and
# qwen3_5_moe: gated attention split, Gated DeltaNet layers whole on every rank.


def _run(llm: LLM) -> tuple[list[list[int]], list[list[float]]]:
    out = llm.generate(PROMPTS, GREEDY)
    return [r.token_ids for r in out], [[lp.logprob for lp in r.logprobs] for r in out]


@pytest.mark.parametrize("case", list(CASES))
def test_tp2_equals_tp1(case, tmp_path_factory, tp_llm):
    arch, layout, overrides = CASES[case]
    path = checkpoint(tmp_path_factory, arch, layout, **overrides)
    tokens1, logprobs1 = _run(LLM(str(path), device="cpu", dtype="float32"))
    llm = tp_llm(path)
    tokens2, logprobs2 = _run(llm)
    assert tokens2 == tokens1, f"{case}: TP=2 greedy tokens differ from TP=1"
    worst = max(abs(a - b) for r1, r2 in zip(logprobs1, logprobs2) for a, b in zip(r1, r2))
    assert worst < 1e-4, f"{case}: logprob differs by {worst:.2e}"


def test_rank_holds_its_shard(tmp_path_factory, tp_llm):
    """Rank 0 holds half of every split tensor (not the full model): attention, experts and
    the LM head halve; the router, norms and embedding stay whole."""
    path = checkpoint(tmp_path_factory, "qwen2_moe")
    one = LLM(str(path), device="cpu", dtype="float32").engine.model
    two = tp_llm(path).engine.model
    a1, a2 = one.model.layers[1], two.model.layers[1]
    assert a2.self_attn.qkv_proj.weight.shape[0] * 2 == a1.self_attn.qkv_proj.weight.shape[0]
    assert a2.self_attn.o_proj.weight.shape[1] * 2 == a1.self_attn.o_proj.weight.shape[1]
    w13_1, w13_2 = a1.mlp.experts.expert_tensors["w13"], a2.mlp.experts.expert_tensors["w13"]
    assert w13_2.shape[1] * 2 == w13_1.shape[1] and w13_2.shape[0] == w13_1.shape[0]
    assert two.lm_head.weight.shape[0] * 2 == one.lm_head.weight.shape[0]
    assert a2.mlp.gate.weight.shape == a1.mlp.gate.weight.shape
    total = sum(p.numel() for p in one.parameters())
    assert sum(p.numel() for p in two.parameters()) < 0.75 * total


def test_dummy_weights_same_model_at_every_tp_size(tp_llm, tmp_path_factory):
    """Dummy weights are drawn at full size in the one-rank order and narrowed: TP=2 runs
    the same model as TP=1 from the same seed (what the GPU benchmarks compare)."""
    path = checkpoint(tmp_path_factory, "qwen2_moe")
    one = LLM(str(path), device="cpu", dtype="float32", load_format="dummy", dummy_weights_seed=3)
    assert _run(tp_llm(path, load_format="dummy", dummy_weights_seed=3))[0] == _run(one)[0]


def test_look_ahead_and_seeded_sampling(tmp_path_factory, tp_llm):
    """Decode look-ahead under TP (the queued step's ids reach the followers by a device
    broadcast) gives the same greedy tokens; rank 0 alone samples, with the requests' own
    generators, so seeded sampling draws what one rank draws."""
    path = checkpoint(tmp_path_factory, "mixtral")
    params = [
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=8, max_tokens=20, ignore_eos=True),
    ]
    one = LLM(str(path), device="cpu", dtype="float32", decode_look_ahead=True)
    llm = tp_llm(path, decode_look_ahead=True)
    expected = [r.token_ids for r in one.generate(PROMPTS, params)]
    assert [r.token_ids for r in llm.generate(PROMPTS, params)] == expected
    assert llm.engine.runner.look_ahead_counts["used"] > 10
