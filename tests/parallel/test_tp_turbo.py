"""A TurboQuant KV cache under tensor parallelism over 2 CPU ranks (gloo): each rank
quantizes its own KV heads (the rows are per head, so the split changes nothing but the
last-bit noise of the row-parallel sums), and greedy output equals one rank's."""

from __future__ import annotations

import pytest
import tiny_models as tm
from tp_checkpoints import checkpoint

from xinfer import LLM, SamplingParams
from xinfer.kv.turbo import TurboKVCache

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
PROMPTS = tm.prompts(3, seed=11)


def _run(llm: LLM) -> tuple[list[list[int]], list[list[float]]]:
    out = llm.generate(PROMPTS, GREEDY)
    return [r.token_ids for r in out], [[lp.logprob for lp in r.logprobs] for r in out]


@pytest.mark.slow  # two rank processes (~20-50 s on two cores)
def test_tp2_turbo4_equals_tp1(tmp_path_factory, tp_llm):
    path = checkpoint(tmp_path_factory, "qwen3_moe")
    one = LLM(str(path), device="cpu", dtype="float32", kv_cache_dtype="turbo4")
    tokens1, logprobs1 = _run(one)
    two = tp_llm(path, kv_cache_dtype="turbo4")
    cache = two.engine.runner.kv_caches[0]
    assert isinstance(cache, TurboKVCache) and cache.num_kv_heads == 1  # 2 KV heads, 2 ranks
    tokens2, logprobs2 = _run(two)
    assert tokens2 == tokens1
    worst = max(abs(a - b) for r1, r2 in zip(logprobs1, logprobs2) for a, b in zip(r1, r2))
    assert worst < 1e-3, worst
