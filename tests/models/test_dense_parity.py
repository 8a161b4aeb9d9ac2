"""Dense models (llama, qwen2, qwen3, gemma3) against transformers on tiny random HF
checkpoints (CPU, float32): greedy tokens and last-position logits. Gemma 3's window (8)
is shorter than the prompts, so its local layers' masking is exercised. Their forward makes
no tensor from host data, which a CUDA graph capture would refuse."""

from __future__ import annotations

import dense_models as dm
import pytest
import tiny_models as tm
import torch
from host_data import watch_forward

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


def test_forward_makes_no_tensor_from_host_data(pair, monkeypatch):
    """The CUDA graphs capture the model's forward and LM head; a host-to-device copy in
    them (`torch.tensor(..., device=x.device)`) makes the capture fail on the GPU ("Cannot
    copy between CPU and CUDA tensors during CUDA graph capture"), which CPU runs never
    show: Gemma 3's embedding scale did. Checked here on CPU, prefill and decode."""
    _, llm = pair
    host_data = watch_forward(llm.engine.runner.model, monkeypatch)
    llm.generate([tm.prompts(1, seed=3)[0]], SamplingParams(temperature=0, max_tokens=3))
    assert host_data.seen == []


def test_greedy_mismatch_names_the_first_difference():
    """The Gemma 3 window tests' comparison (dense_models.greedy_mismatch): a flip at a
    clear margin fails with the position, both tokens and the margin in one short line; a
    flip at a near tie ends the comparison; a logprob off by more than 1e-4 fails."""
    logits = [torch.tensor([0.0, 2.0, 1.0]), torch.tensor([0.5, 0.0, 0.5 + 1e-4])]
    lp = [torch.log_softmax(t.double(), -1) for t in logits]
    ok = [lp[0][1].item(), lp[1][2].item()]
    assert dm.greedy_mismatch([1, 2], ok, [1, 2], logits) is None
    assert dm.greedy_mismatch([1, 0], ok, [1, 2], logits) is None  # a near tie (1e-4)
    why = dm.greedy_mismatch([2, 2], ok, [1, 2], logits)
    assert why == "token 0: ours 2, transformers 1, its logit margin 1.00e+00"
    off = dm.greedy_mismatch([1, 2], [ok[0], ok[1] + 1e-3], [1, 2], logits)
    assert off is not None and off.startswith("token 1 (2): logprob")
    assert dm.greedy_mismatch([1], ok[:1], [1, 2], logits) == "1 tokens, transformers 2"
