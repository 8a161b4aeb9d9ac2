"""Hybrid models (Qwen3-Next, Qwen3.5-MoE: Gated DeltaNet + gated attention) beyond the
shared parity tests: prompts spanning several prefill chunks (the recurrent state carried
across them) equal one-shot prefill and transformers; preemption under KV pressure and
aborts mid-prefill and mid-decode leave every request's output exact and give back every
state slot; a `…ForConditionalGeneration` checkpoint loads its text model, skipping the
vision tower and MTP weights with one log line each (a Qwen3-Next checkpoint its MTP weights)."""

from __future__ import annotations

import logging

import pytest
import tiny_models as tm
import torch

from xinfer import LLM, SamplingParams

HYBRID = ["qwen3_next", "qwen3_5_moe"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _long_prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (ln,), generator=g).tolist() for ln in (45, 38, 7, 52)[:n]]


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", params=HYBRID)
def ckpt(request, tmp_path_factory):
    hf = tm.make_hf_model(request.param, seed=5)
    return hf, tm.write_checkpoint(hf, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def ckpt35(tmp_path_factory):
    """Engine mechanics (aborts, look-ahead, budget) are the same for both models."""
    hf = tm.make_hf_model("qwen3_5_moe", seed=5)
    return hf, tm.write_checkpoint(hf, tmp_path_factory.mktemp("qwen3_5_moe"))


def _slots_all_free(llm: LLM) -> bool:
    engine = llm.engine
    slots = engine.scheduler.state_slots
    return slots.num_free == slots.num_slots == engine.num_state_slots


def test_chunked_prefill_equals_one_shot_and_transformers(ckpt):
    hf, path = ckpt
    prompts = _long_prompts(4, seed=1)
    one_shot = LLM(str(path), device="cpu", dtype="float32")
    chunked = LLM(str(path), device="cpu", dtype="float32", max_num_batched_tokens=16)
    want = [r.token_ids for r in one_shot.generate(prompts, GREEDY)]
    assert [r.token_ids for r in chunked.generate(prompts, GREEDY)] == want  # 3–4 chunks each
    assert [chunked.generate([p], GREEDY)[0].token_ids for p in prompts] == want
    assert want == [_hf_greedy(hf, p, GREEDY.max_tokens) for p in prompts]
    assert _slots_all_free(chunked) and _slots_all_free(one_shot)


def test_preemption_keeps_outputs_exact_and_frees_slots(ckpt):
    _, path = ckpt
    prompts = _long_prompts(4, seed=2)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    roomy = LLM(str(path), device="cpu", block_size=4)
    alone = [roomy.generate([p], params)[0].token_ids for p in prompts]
    # 22 blocks of 4 = 88 tokens for 45+38+7+52 + 4*30 = 262 tokens of work
    tight = LLM(
        str(path), device="cpu", block_size=4, num_kv_blocks=22, max_model_len=88,
        max_num_batched_tokens=16,
    )  # fmt: skip
    sched = tight.engine.scheduler
    preempted, schedule = [], sched.schedule

    def counting_schedule():
        out = schedule()
        preempted.append(out.num_preempted)
        return out

    sched.schedule = counting_schedule
    assert [r.token_ids for r in tight.generate(prompts, params)] == alone
    assert sum(preempted) > 0, "the test did not exercise preemption"
    assert tight.engine.allocator.num_free == 22 and _slots_all_free(tight)


def test_aborts_mid_prefill_and_mid_decode_free_their_slots(ckpt35):
    _, path = ckpt35
    prompts = _long_prompts(4, seed=3)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = LLM(str(path), device="cpu", max_num_batched_tokens=16, max_num_seqs=3)
    alone = [llm.generate([p], params)[0].token_ids for p in prompts]
    engine = llm.engine
    engine.scheduler.layered_prompts = False  # chunk by chunk (prompt passes: test_prompt_pass)
    ids = [engine.add_request(p, params) for p in prompts]
    outputs: dict[str, list[int]] = {i: [] for i in ids}
    for _ in range(2):  # 32 of request 0's 45 prompt tokens: still in its prefill
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
    assert engine.requests[ids[0]].num_computed_tokens < len(prompts[0])
    engine.abort_request(ids[0])
    while not outputs[ids[2]]:  # request 2 (7 tokens) starts decoding
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
    engine.abort_request(ids[2])
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
    assert outputs[ids[1]] == alone[1] and outputs[ids[3]] == alone[3]
    assert engine.allocator.num_free == engine.allocator.num_blocks and _slots_all_free(llm)


def _run_schedule(llm: LLM, schedule: dict[int, list]) -> dict[str, list[int]]:
    """Step the engine, adding `schedule[step]`'s (prompt, params) before that step."""
    engine, tokens, step = llm.engine, {}, 0
    while step <= max(schedule) or engine.has_unfinished():
        for prompt, params in schedule.get(step, []):
            tokens[engine.add_request(prompt, params)] = []
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
        step += 1
    return tokens


def test_look_ahead_with_double_buffered_state(ckpt35):
    """Decode look-ahead queues the next step, which advances the recurrent state; with two
    rows per slot a queued step that arrivals or finishes drop leaves the state it read, so
    the tokens equal the plain engine's."""
    _, path = ckpt35
    prompts = _long_prompts(4, seed=6)
    g = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (24, 6, 14, 9)]
    # arrivals at 2 and 8 come right after queued steps (which they drop)
    schedule = {0: [(prompts[0], g[0]), (prompts[2], g[1])], 2: [(prompts[1], g[2])]}
    schedule.update({8: [(prompts[3], g[3])], 13: [(prompts[2], g[1])]})
    plain = LLM(str(path), device="cpu", decode_look_ahead=False)
    ahead = LLM(str(path), device="cpu", decode_look_ahead=True, max_num_seqs=4)
    assert plain.engine.state_copies == 1 and ahead.engine.state_copies == 2
    assert ahead.engine.runner.state_caches[0][1].shape[0] == 8  # 4 slots × 2 rows
    assert _run_schedule(ahead, schedule) == _run_schedule(plain, schedule)
    counts = ahead.engine.runner.look_ahead_counts
    assert counts["used"] > 5 and counts["dropped"] >= 2
    assert _slots_all_free(ahead)


def test_state_budget_is_reported(ckpt35, caplog):
    _, path = ckpt35
    with caplog.at_level(logging.INFO, logger="xinfer"):
        llm = LLM(str(path), device="cpu", max_num_seqs=5)
    assert any("recurrent state for 5 sequences" in r.getMessage() for r in caplog.records)
    cfg = llm.engine.model_config
    assert llm.engine.num_state_slots == 5
    assert llm.engine.allocator.prefix_cache is None  # KV blocks cannot restore the state
    assert cfg.kv_layer_ids == [1, 3] and cfg.linear_layer_ids == [0, 2]
    conv = 3 * (2 * 2 * 16 + 4 * 16) * 4  # (K-1) × conv channels × float32
    assert cfg.state_bytes_per_seq(torch.float32) == 2 * (conv + 4 * 16 * 16 * 4)
    states = llm.engine.runner.state_caches
    assert [tuple(c.shape) for c, _ in states] == [(5, 3, 128)] * 2
    assert [tuple(s.shape) for _, s in states] == [(5, 4, 16, 16)] * 2


def _conditional_generation_checkpoint(path):
    """A tiny `Qwen3_5MoeForConditionalGeneration` (vision tower included) written by
    transformers, plus two MTP tensors as the published checkpoints carry."""
    import transformers as tf
    from safetensors.torch import load_file, save_file

    text = tm.hf_config_kwargs("qwen3_5_moe")
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=48, out_hidden_size=64)
    torch.manual_seed(7)
    cfg = tf.Qwen3_5MoeConfig(text_config=text, vision_config=vision)
    hf = tf.Qwen3_5MoeForConditionalGeneration(cfg).eval()
    tm._perturb_hybrid_inits(hf)
    hf.save_pretrained(path)
    shard = path / "model.safetensors"
    tensors = load_file(str(shard))
    assert any(k.startswith("model.visual.") for k in tensors)
    tensors["mtp.fc.weight"] = torch.randn(64, 128)
    tensors["mtp.norm.weight"] = torch.randn(64)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return hf


def test_conditional_generation_checkpoint_loads_text_model(tmp_path, caplog):
    hf = _conditional_generation_checkpoint(tmp_path / "m")
    with caplog.at_level(logging.INFO, logger="xinfer"):
        llm = LLM(str(tmp_path / "m"), device="cpu", dtype="float32")
    skips = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skips) == 2
    assert any("model.visual." in m and "vision tower" in m for m in skips)
    assert any("'mtp.'" in m and "speculative" in m for m in skips)
    prompts = _long_prompts(3, seed=4)
    ours = [r.token_ids for r in llm.generate(prompts, GREEDY)]
    assert ours == [_hf_greedy(hf, p, GREEDY.max_tokens) for p in prompts]


def test_qwen3_next_skips_mtp_weights(tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    hf = tm.make_hf_model("qwen3_next", seed=2)
    path = tm.write_checkpoint(hf, tmp_path / "m")
    shard = path / "model.safetensors"
    tensors = load_file(str(shard))
    tensors["mtp.fc.weight"] = torch.randn(64, 128)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with caplog.at_level(logging.INFO, logger="xinfer"):
        llm = LLM(str(path), device="cpu", dtype="float32")
    skips = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skips) == 1 and "'mtp.'" in skips[0] and "speculative" in skips[0]
    prompt = _long_prompts(1, seed=7)[0]
    assert llm.generate([prompt], GREEDY)[0].token_ids == _hf_greedy(hf, prompt, GREEDY.max_tokens)
