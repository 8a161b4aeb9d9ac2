"""bench/bench_kv_quality.py on the demo model (CPU, float32): the method is unbiased — the
model-dtype cache measured against its own greedy continuation agrees at every position (a
prompt pass over each prefix picks what decode picked) and keeps every greedy token."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

TOKENS = 4


@pytest.fixture(scope="module")
def setup():
    import bench_kv_quality as bench

    from xinfer import LLM, SamplingParams

    kw = dict(device="cpu", dtype="float32", max_model_len=128)
    base = LLM("demo", **kw)
    prompts = [base.engine.tokenizer.encode(p) for p in bench.PROMPTS[:2]]
    greedy = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    ref = [r.token_ids for r in base.generate(prompts, greedy)]
    return bench, prompts, ref, kw


def test_the_model_dtype_cache_agrees_with_itself(setup):
    bench, prompts, ref, kw = setup
    row = bench.measure("demo", "auto", prompts, ref, **kw)
    assert row["agreement"] == 1.0 and row["positions"] == 2 * TOKENS
    assert row["equal_greedy_prefix"] == [TOKENS] * 2


def test_first_difference():
    import bench_kv_quality as bench

    assert bench.first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert bench.first_difference([1, 2], [1, 2]) == 2
