"""Decode look-ahead (the next step queued before this one's tokens are read) changes nothing
a user sees: token ids and logprobs equal the plain engine's when requests finish at
different steps, stop on a token mid-stream, arrive while others decode, are preempted, mix
greedy and sampled rows (seeded, or drawing from the default generator), or run with MoE
offload. A dropped queued step has drawn random numbers; they are put back. On CPU the
queued step runs eagerly, so these tests exercise the bookkeeping (which queued steps are
used, which are dropped, which random streams are restored)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams

PROMPTS = prompts(4, seed=5)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    model = make_hf_model("qwen3_moe", seed=11, num_experts=16)
    return str(write_checkpoint(model, tmp_path_factory.mktemp("look_ahead")))


def run(path: str, look_ahead: bool, schedule, **llm_kwargs):
    """Drive the engine step by step; `schedule` maps step index → [(prompt, params)] to add
    then. Returns per request (token ids, logprobs) and the runner's look-ahead counts."""
    llm = LLM(path, device="cpu", decode_look_ahead=look_ahead, **llm_kwargs)
    torch.manual_seed(1234)  # unseeded sampled rows draw from the default generator
    engine = llm.engine
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list[float]] = {}
    step = 0
    while step in schedule or engine.has_unfinished() or step < max(schedule):
        for prompt, params in schedule.get(step, []):
            rid = engine.add_request(prompt, params)
            tokens[rid], logprobs[rid] = [], []
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            logprobs[out.request_id].extend(
                lp.logprob for lp in (out.new_logprobs or []) if lp is not None
            )
        step += 1
    return tokens, logprobs, dict(engine.runner.look_ahead_counts)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def assert_same(path, schedule, **llm_kwargs):
    base_tokens, base_lps, counts = run(path, False, schedule, **llm_kwargs)
    assert counts == {"used": 0, "dropped": 0}
    tokens, lps, counts = run(path, True, schedule, **llm_kwargs)
    assert tokens == base_tokens
    assert lps == base_lps
    return base_tokens, counts


def test_batch_finishing_at_different_steps(model_path):
    schedule = {0: [(p, greedy(n, logprobs=2)) for p, n in zip(PROMPTS, (24, 7, 16, 3))]}
    tokens, counts = assert_same(model_path, schedule)
    assert [len(t) for t in tokens.values()] == [24, 7, 16, 3]
    assert counts["used"] > 10  # the steady stretches ran on queued steps


def test_stop_token_mid_stream_drops_the_queued_step(model_path):
    first, _, _ = run(model_path, False, {0: [(PROMPTS[1], greedy(20))]})
    stop_at = next(iter(first.values()))[6]  # a token the model produces at step 6
    params = SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[stop_at])
    schedule = {0: [(PROMPTS[1], params), (PROMPTS[2], greedy(20))]}
    tokens, counts = assert_same(model_path, schedule)
    assert len(next(iter(tokens.values()))) <= 7
    assert counts["dropped"] >= 1


def test_arrivals_and_sampled_rows(model_path):
    seeded = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8, seed=3)
    schedule = {
        0: [(PROMPTS[0], greedy(24)), (PROMPTS[3], greedy(24))],
        5: [(PROMPTS[1], greedy(6))],  # arrives while the first two decode
        6: [(PROMPTS[1], greedy(6))],
        12: [(PROMPTS[2], seeded)],  # a sampled row joins the greedy ones
    }
    _, counts = assert_same(model_path, schedule)
    assert counts["used"] > 0 and counts["dropped"] > 0


def sampled(max_tokens: int, seed: int | None, **kw) -> SamplingParams:
    return SamplingParams(
        temperature=1.0, top_k=50, max_tokens=max_tokens, seed=seed, ignore_eos=True, **kw
    )


@pytest.mark.parametrize("seed", [7, None], ids=["seeded", "default-generator"])
def test_sampled_rows_look_ahead_and_dropped_steps_draw_nothing(model_path, seed):
    """Sampled rows run on queued steps too; arrivals drop queued steps that had already
    drawn for the running rows, and the rows' later tokens still equal the plain engine's."""
    schedule = {
        0: [(PROMPTS[0], sampled(30, seed, logprobs=1)), (PROMPTS[1], sampled(12, seed))],
        4: [(PROMPTS[2], greedy(5))],  # arrivals: the step queued before them is dropped
        9: [(PROMPTS[3], sampled(6, None if seed is None else seed + 1))],
        17: [(PROMPTS[2], sampled(4, seed, min_tokens=3))],
    }
    tokens, counts = assert_same(model_path, schedule)
    assert counts["used"] > 10 and counts["dropped"] >= 2
    assert len(set(next(iter(tokens.values())))) > 3  # really sampled, not one repeated token


def test_preemption_under_kv_pressure(model_path):
    """16 blocks of 4 tokens for 95 tokens of work: requests are preempted and recomputed."""
    schedule = {0: [(PROMPTS[0], greedy(30)), (PROMPTS[3], greedy(30))]}
    assert_same(model_path, schedule, num_kv_blocks=16, block_size=4, max_model_len=64)


def test_with_moe_offload(model_path):
    schedule = {0: [(p, greedy(20)) for p in PROMPTS[:3]]}
    base, _, _ = run(model_path, False, schedule)
    tokens, _, counts = run(model_path, True, schedule, moe_offload=0.25)
    assert tokens == base and counts["used"] > 0
