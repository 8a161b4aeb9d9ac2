"""Prefix caching on CUDA (Triton kernels, CUDA-graph decode, decode look-ahead, offload):
requests sharing a prefix hit the cache and give the greedy tokens of an engine without it,
also under preemption; the per-request timings and the stats line work on the GPU."""

from __future__ import annotations

import random

import pytest
import tiny_models as tm

from xinfer import LLM, SamplingParams

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
_rng = random.Random(8)
STEM = [_rng.randrange(256) for _ in range(150)]
PROMPTS = [STEM + [_rng.randrange(256) for _ in range(k)] for k in (7, 0, 33, 1, 16)]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    model = tm.make_hf_model("qwen3_moe", seed=2, num_experts=16)
    return str(tm.write_checkpoint(model, tmp_path_factory.mktemp("prefix_gpu")))


@pytest.fixture(scope="module")
def expected(path):
    llm = LLM(path, device="cuda:0", dtype="bfloat16", enable_prefix_caching=False)
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),  # graphs + look-ahead
        dict(max_num_batched_tokens=64),  # chunked prefill
        dict(num_kv_blocks=40, block_size=16, max_model_len=256),  # preemption
        dict(moe_offload=0.25),
    ],
    ids=["graphs", "chunked", "preemption", "offload"],
)
def test_cached_prefixes_keep_greedy_tokens(path, expected, kwargs):
    llm = LLM(path, device="cuda:0", dtype="bfloat16", max_num_seqs=8, **kwargs)
    assert [r.token_ids for r in llm.generate(PROMPTS, GREEDY)] == expected
    assert [r.token_ids for r in llm.generate(PROMPTS[::-1], GREEDY)] == expected[::-1]
    stats = llm.engine.prefix_cache_stats()
    assert stats.hits >= 4 * 144  # every later prompt reuses the stem's 9 full blocks
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks


def test_summary_stats_line_and_timings_on_gpu(path, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="xinfer"):
        llm = LLM(path, device="cuda:0", dtype="bfloat16", log_stats_interval=1e-6)
        engine = llm.engine
        engine.add_request(PROMPTS[0], GREEDY)
        metrics = []
        while engine.has_unfinished():
            metrics += [out.metrics for out in engine.step() if out.finished]
    messages = [r.getMessage() for r in caplog.records]
    [ready] = [m for m in messages if "ready in" in m]
    assert "cuda:0 (" in ready and "CUDA graphs on" in ready and "prefix caching on" in ready
    assert any(m.startswith("engine: prompt") for m in messages)
    [m] = metrics
    assert m.num_output_tokens == 24 and m.prefill_s > 0 and m.decode_s > 0
