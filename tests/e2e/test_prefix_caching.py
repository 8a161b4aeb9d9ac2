"""Prefix caching end to end: requests sharing a prefix hit the cache and give the same
greedy tokens as an engine without it, also with chunked prefill, preemption under KV
pressure, aborts, decode look-ahead and MoE offload; a model that declares it unsupported
runs without it (one log line)."""

from __future__ import annotations

import logging
import random

import pytest
from tiny_models import make_hf_model, write_checkpoint

from xinfer import LLM, SamplingParams
from xinfer.models.moe_decoder import MoeForCausalLM

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
_rng = random.Random(3)
STEM = [_rng.randrange(256) for _ in range(70)]
PROMPTS = [STEM + [_rng.randrange(256) for _ in range(k)] for k in (5, 0, 19, 2)]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    model = make_hf_model("qwen3_moe", seed=4, num_experts=16)
    return str(write_checkpoint(model, tmp_path_factory.mktemp("prefix")))


@pytest.fixture(scope="module")
def expected(model_path):
    """Each prompt's greedy tokens, alone, without prefix caching."""
    llm = LLM(model_path, device="cpu", enable_prefix_caching=False)
    assert llm.engine.prefix_cache_stats() is None
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


def tokens(results) -> list[list[int]]:
    return [r.token_ids for r in results]


def test_shared_prefix_hits_and_keeps_greedy_tokens(model_path, expected):
    llm = LLM(model_path, device="cpu")
    first = llm.generate([PROMPTS[0]], GREEDY)[0]
    assert first.token_ids == expected[0]
    stats = llm.engine.prefix_cache_stats()
    assert (stats.queries, stats.hits) == (len(PROMPTS[0]), 0)
    rid = llm.engine.add_request(PROMPTS[2], GREEDY)
    req = llm.engine.requests[rid]
    out = []
    while llm.engine.has_unfinished():
        out += [t for d in llm.engine.step() for t in d.new_token_ids]
    assert out == expected[2]
    assert req.num_cached_tokens == 64  # the 70-token stem's four full blocks of 16
    assert stats.hits == 64 and stats.queries == len(PROMPTS[0]) + len(PROMPTS[2])
    # The whole batch again: everything but each prompt's last block comes from the cache.
    assert tokens(llm.generate(PROMPTS, GREEDY)) == expected
    assert stats.hit_rate > 0.6


def test_continuing_a_conversation_reuses_the_answer(model_path):
    """Turn 2's prompt contains turn 1's answer, whose blocks decode computed."""
    plain = LLM(model_path, device="cpu", enable_prefix_caching=False)
    cached = LLM(model_path, device="cpu")
    long_answer = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    answer = cached.generate([PROMPTS[1]], long_answer)[0].token_ids
    turn2 = PROMPTS[1] + answer + [1, 2, 3]
    before = cached.engine.prefix_cache_stats().hits
    assert (
        cached.generate([turn2], GREEDY)[0].token_ids
        == plain.generate([turn2], GREEDY)[0].token_ids
    )
    assert cached.engine.prefix_cache_stats().hits - before == 96  # 6 blocks: prompt+answer


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(max_num_batched_tokens=16),  # chunked prefill: blocks cached chunk by chunk
        dict(num_kv_blocks=16, block_size=8, max_model_len=128),  # preemption
        dict(decode_look_ahead=True),
        dict(moe_offload=0.25),
    ],
    ids=["chunked", "preemption", "look-ahead", "offload"],
)
def test_batches_match_the_uncached_engine(model_path, expected, kwargs):
    llm = LLM(model_path, device="cpu", **kwargs)
    preempted = []
    schedule = llm.engine.scheduler.schedule

    def counting_schedule():
        out = schedule()
        preempted.append(out.num_preempted)
        return out

    llm.engine.scheduler.schedule = counting_schedule
    assert tokens(llm.generate(PROMPTS, GREEDY)) == expected
    assert tokens(llm.generate(PROMPTS[::-1], GREEDY)) == expected[::-1]
    assert llm.engine.prefix_cache_stats().hits > 0
    if "num_kv_blocks" in kwargs:
        assert sum(preempted) > 0, "the test did not exercise preemption"
    assert llm.engine.allocator.num_free == llm.engine.allocator.num_blocks


def test_abort_mid_prefill_and_decode_then_reuse(model_path, expected):
    llm = LLM(model_path, device="cpu", max_num_batched_tokens=32)
    engine = llm.engine
    mid_prefill = engine.add_request(PROMPTS[2], GREEDY)
    engine.step()  # 32 of its 89 tokens computed
    engine.abort_request(mid_prefill)
    decoding = engine.add_request(PROMPTS[0], GREEDY)
    for _ in range(5):
        engine.step()
    engine.abort_request(decoding)
    assert engine.allocator.num_free == engine.allocator.num_blocks
    assert tokens(llm.generate(PROMPTS, GREEDY)) == expected
    assert engine.prefix_cache_stats().hits > 0


def test_a_model_without_support_runs_without_prefix_caching(
    model_path, expected, monkeypatch, caplog
):
    monkeypatch.setattr(MoeForCausalLM, "supports_prefix_caching", False)
    with caplog.at_level(logging.INFO, logger="xinfer"):
        llm = LLM(model_path, device="cpu")
    lines = [r.getMessage() for r in caplog.records if "prefix caching is off" in r.getMessage()]
    assert len(lines) == 1 and "Qwen3MoeForCausalLM" in lines[0]
    assert llm.engine.prefix_cache_stats() is None
    assert tokens(llm.generate(PROMPTS[:2], GREEDY)) == expected[:2]
