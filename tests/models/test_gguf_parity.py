"""GGUF files written with the `gguf` package's writer from tiny transformers models, run by
xinfer and by transformers loading the same file (`gguf_file=`): greedy tokens and logits
agree (MoE qwen3moe; dense llama with its permuted q/k, qwen3, gemma3 with 1 + w norms).
The MoE file also gives the same bytes at every offload fraction."""

from __future__ import annotations

import dense_models as dm
import gguf_files as gf
import pytest
import tiny_models as tm
import torch

from xinfer import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16)
MOE_META = dict(expert_count=8, expert_used_count=2, expert_feed_forward_length=32)
# (id, GGUF arch, maker, GGUF block type of the matrices, extra metadata)
CASES = [
    ("qwen3moe-q8_0", "qwen3moe", lambda: tm.make_hf_model("qwen3_moe", mlp_only_layers=[]),
     "Q8_0", MOE_META),
    ("llama-q4_0", "llama", lambda: dm.make_dense("llama"), "Q4_0", {}),
    ("qwen3-q5_0", "qwen3", lambda: dm.make_dense("qwen3"), "Q5_0", {}),
    ("gemma3-bf16", "gemma3", lambda: dm.make_dense("gemma3_text", final_logit_softcapping=None),
     "BF16", {"sliding_window": 8}),
]  # fmt: skip


def _transformers_on_file(hf, path):
    from transformers import AutoModelForCausalLM

    # config given: transformers' GGUF config mapping lacks some keys (expert sizes)
    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, config=hf.config, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request, tmp_path_factory):
    _, arch, make, qtype, meta = request.param
    hf = make()
    path = gf.write_gguf(hf, tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch, qtype, meta)
    return path, _transformers_on_file(hf, path)


def test_gguf_matches_transformers_on_the_same_file(case):
    path, ref = case
    llm = LLM(str(path), device="cpu", dtype="float32")
    prompts = tm.prompts(3, seed=1)
    for prompt, result in zip(prompts, llm.generate(prompts, GREEDY)):
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
        assert result.token_ids == want[0, len(prompt) :].tolist()
    prompt = tm.prompts(4, seed=2)[3]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=5))[0]
    with torch.no_grad():
        logp = torch.log_softmax(ref(torch.tensor([prompt])).logits[0, -1].float(), -1)
    top = out.logprobs[0]
    for token_id, value in zip(top.top_ids, top.top_logprobs):
        assert abs(value - logp[token_id].item()) < 1e-4


def test_gguf_moe_offload_is_byte_identical_across_fractions(tmp_path):
    hf = tm.make_hf_model("qwen3_moe", mlp_only_layers=[])
    path = gf.write_gguf(hf, tmp_path / "moe.gguf", "qwen3moe", "Q4_0", MOE_META)
    prompts = tm.prompts(4, seed=5)
    params = SamplingParams(temperature=0, max_tokens=12)
    base = [
        r.token_ids for r in LLM(str(path), device="cpu", dtype="float32").generate(prompts, params)
    ]
    for fraction in (0.25, 0.5, 1.0):
        llm = LLM(str(path), device="cpu", dtype="float32", moe_offload=fraction)
        assert llm.engine.offload_manager is not None
        assert [r.token_ids for r in llm.generate(prompts, params)] == base
