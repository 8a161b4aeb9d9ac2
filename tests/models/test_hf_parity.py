"""Every architecture against transformers on tiny random checkpoints (CPU, float32):
greedy continuations token for token, last-position logits, prefill-then-decode vs a full
forward, and batched vs one-by-one generation; both checkpoint layouts."""

from __future__ import annotations

import pytest
import tiny_models as tm
import torch

from xinfer import LLM, SamplingParams
from xinfer.engine.request import Request
from xinfer.engine.scheduler import ScheduledRequest, SchedulerOutput

ARCHS = list(tm.ARCHS)
GREEDY = SamplingParams(temperature=0, max_tokens=32)


@pytest.fixture(
    scope="module",
    params=[(a, lay) for a in ARCHS for lay in ("per_expert", "fused")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def pair(request, tmp_path_factory):
    arch, layout = request.param
    hf = tm.make_hf_model(arch)
    path = tm.write_checkpoint(hf, tmp_path_factory.mktemp(f"{arch}-{layout}"), layout)
    return hf, LLM(str(path), device="cpu", dtype="float32")


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


def test_greedy_matches_transformers(pair):
    hf, llm = pair
    prompts = tm.prompts(4, seed=1)
    ours = llm.generate(prompts, GREEDY)
    for prompt, result in zip(prompts, ours):
        assert result.token_ids == _hf_greedy(hf, prompt, 32)
        assert result.finish_reason == "length"


def _last_logits(llm: LLM, prompt: list[int]) -> torch.Tensor:
    """Prefill `prompt` through the runner and return its last-position logits."""
    engine = llm.engine
    req = Request("probe", list(prompt), GREEDY)
    req.block_ids = engine.allocator.allocate(engine.allocator.blocks_for(len(prompt)))
    try:
        inp = engine.runner.prepare(SchedulerOutput([ScheduledRequest(req, len(prompt))]))
        hidden = engine.runner.forward(inp)
        return engine.model.compute_logits(hidden[inp.logits_indices])[0]
    finally:
        engine.allocator.free(req.block_ids)


def test_last_position_logits(pair):
    hf, llm = pair
    for prompt in tm.prompts(3, seed=2):
        ours = _last_logits(llm, prompt)
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0, -1].float()
        rel = (ours - ref).norm() / ref.norm()
        assert rel < 1e-4, f"relative logits error {rel:.2e}"


def test_prefill_then_decode_equals_full_forward(pair):
    """Logits of each decode step (one token against the cache) equal a full forward."""
    hf, llm = pair
    prompt = tm.prompts(1, seed=3)[0]
    result = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, logprobs=1))[0]
    full = prompt + result.token_ids
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([full])).logits[0].float(), -1)
    for i, lp in enumerate(result.logprobs):
        pos = len(prompt) - 1 + i  # logits at pos predict token pos + 1
        assert lp.token_id == full[pos + 1]
        assert abs(lp.logprob - ref[pos, full[pos + 1]].item()) < 1e-4


def test_batch_equals_one_by_one(pair):
    _, llm = pair
    prompts = tm.prompts(3, seed=4)  # unequal lengths
    batched = [r.token_ids for r in llm.generate(prompts, GREEDY)]
    alone = [llm.generate([p], GREEDY)[0].token_ids for p in prompts]
    assert batched == alone


def test_chunked_prefill_matches(tmp_path):
    """A prompt split over several steps (tiny token budget) gives the same tokens."""
    hf = tm.make_hf_model("qwen3_moe")
    path = tm.write_checkpoint(hf, tmp_path / "m")
    llm = LLM(str(path), device="cpu", dtype="float32", max_num_batched_tokens=16)
    prompt = tm.prompts(4, seed=5)[3]  # 30 tokens → two chunks
    assert llm.generate([prompt], GREEDY)[0].token_ids == _hf_greedy(hf, prompt, 32)
