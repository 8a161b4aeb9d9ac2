"""Dense models (llama, qwen2, qwen3, gemma3) against transformers on tiny random HF
checkpoints (CPU, float32): greedy tokens and last-position logits. Gemma 3's window (8)
is shorter than the prompts, so its local layers' masking is exercised."""

from __future__ import annotations

import dense_models as dm
import pytest
import tiny_models as tm
import torch

from xinfer import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=20)


@pytest.fixture(scope="module", params=list(dm.DENSE))
def pair(request, tmp_path_factory):
    hf = dm.make_dense(request.param)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, LLM(str(path), device="cpu", dtype="float32")


def test_dense_greedy_and_logits_match_transformers(pair):
    hf, llm = pair
    assert not llm.engine.model_config.is_moe
    prompts = tm.prompts(4, seed=1)
    results = llm.generate(prompts, GREEDY)
    for prompt, result in zip(prompts, results):
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)
        assert result.token_ids == ref[0, len(prompt) :].tolist()
    prompt = tm.prompts(4, seed=2)[3]  # 30 tokens
    full = prompt + results[0].token_ids[:4]
    lp = llm.generate([full], SamplingParams(temperature=0, max_tokens=1, logprobs=5))[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([full])).logits[0, -1].float(), -1)
    top = lp.logprobs[0]
    assert len(top.top_ids) == 5
    for token_id, logprob in zip(top.top_ids, top.top_logprobs):
        assert abs(logprob - ref[token_id].item()) < 1e-4
