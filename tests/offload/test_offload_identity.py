"""The tested guarantee: greedy output is byte-identical for every offload setting. For
each architecture's tiny checkpoint, 64 greedy tokens of several prompts, batched and one
at a time, through `xinfer.LLM` on CPU, for offload unset, 0.1, 0.25, 0.5 and 1.0 (16
experts, top-2: 2, 4, 8 and 16 slots per layer; 16 = every expert, which runs resident),
with a 16-token step budget:
- the batched decode routes B·k = 6 ids a layer, more than 2 or 4 slots: its extra misses
  use overflow rows (no whole-layer copy);
- the 17- and 40-token prompts are longer than the budget: they run as prompt passes
  (layer by layer over their chunks, each offloaded layer streamed once per prompt), the
  17-token one beside the others' prefill and decode steps, the 40-token one alone.
The slot policy is the default (`lfu`) throughout, and `lru` (which experts stay, not how
they compute) at 0.1 too."""

from __future__ import annotations

import pytest
from tiny_models import ARCHS, make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams

FRACTIONS = [None, 0.1, 0.25, 0.5, 1.0]
LRU_FRACTIONS = [0.1]  # 2 slots of 16: the other policy where misses are most
GREEDY = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
NUM_EXPERTS = 16
BUDGET = 16  # tokens a step: prompts longer than this run as prompt passes
PROMPTS = prompts(3, seed=1)  # 5, 17 and 9 tokens
SINGLE = [PROMPTS[0], prompts(4, seed=2)[3] + prompts(4, seed=3)[1][:10]]  # 5 and 40 tokens


@pytest.fixture(scope="module", params=sorted(ARCHS))
def outputs(request, tmp_path_factory):
    """arch → {fraction: (batched outputs, single outputs, stats)}, one checkpoint each."""
    arch = request.param
    key = "num_local_experts" if arch == "mixtral" else "num_experts"
    model = make_hf_model(arch, seed=3, **{key: NUM_EXPERTS})
    path = write_checkpoint(model, tmp_path_factory.mktemp(arch))
    results = {}
    for fraction in FRACTIONS:
        llm = LLM(str(path), device="cpu", moe_offload=fraction, max_num_batched_tokens=BUDGET)
        batched = [r.token_ids for r in llm.generate(PROMPTS, GREEDY)]
        single = [llm.generate(p, GREEDY)[0].token_ids for p in SINGLE]
        results[fraction] = (batched, single, llm.offload_stats())
    for fraction in LRU_FRACTIONS:
        llm = LLM(
            str(path),
            device="cpu",
            moe_offload=fraction,
            moe_offload_policy="lru",
            max_num_batched_tokens=BUDGET,
        )
        batched = [r.token_ids for r in llm.generate(PROMPTS, GREEDY)]
        single = [llm.generate(p, GREEDY)[0].token_ids for p in SINGLE]
        results["lru", fraction] = (batched, single, llm.offload_stats())
    return arch, results


@pytest.mark.parametrize("fraction", FRACTIONS[1:] + [("lru", f) for f in LRU_FRACTIONS])
def test_greedy_output_identical(outputs, fraction):
    arch, results = outputs
    base_batched, base_single, _ = results[None]
    batched, single, stats = results[fraction]
    assert all(len(t) == 64 for t in batched + single)
    assert batched == base_batched, f"{arch}: batched output changed with offload {fraction}"
    assert single == base_single, f"{arch}: single output changed with offload {fraction}"
    if fraction == 1.0:  # every expert fits: the layers run resident, nothing is looked up
        assert stats["offloaded_layers"] == 0 and stats["calls"] == 0
    else:
        assert stats["calls"] > 0 and stats["hits"] + stats["misses"] > 0  # decode path ran


def test_wide_calls_overflow_and_long_prompts_stream_once(outputs):
    """With 2 or 4 of 16 experts per layer the batched calls touch more experts than there
    are slots: they used overflow rows. Each of the two long prompts (17, 40 tokens)
    streamed every offloaded layer exactly once."""
    arch, results = outputs
    for fraction, slots in ((0.1, 2), (0.25, 4), (0.5, 8), (1.0, 16)):
        assert set(results[fraction][2]["slots_per_layer"]) == {slots}
    for fraction in (0.1, 0.25):
        stats = results[fraction][2]
        assert stats["overflow_misses"] > 0, arch
        num_layers = stats["num_layers"]
        assert [la["staging_copies"] for la in stats["layers"]] == [2] * num_layers, arch
        assert stats["staging_bytes"] > 0
    assert results[1.0][2]["staging_copies"] == 0  # every expert fits: nothing to stream
    assert results[1.0][2]["overflow_misses"] == 0
    assert results[0.5][2]["misses"] > 0


@pytest.mark.parametrize("fraction", [0.1, 0.25])
def test_decode_steps_never_copy_a_whole_layer(tmp_path, fraction):
    """Batched decode with B·k = 8 routed ids a layer against 2 or 4 slots: each decode
    step copies at most the call's own misses (overflow rows take what the slots cannot),
    never a whole layer of 16."""
    path = write_checkpoint(make_hf_model("mixtral", seed=3, num_local_experts=16), tmp_path)
    llm = LLM(str(path), device="cpu", moe_offload=fraction, max_num_batched_tokens=BUDGET)
    engine, params = llm.engine, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts(4, seed=4)):
        engine.add_request(p, params, request_id=f"r{i}")
    while any(r.num_computed_tokens < len(r.prompt_token_ids) for r in engine.requests.values()):
        engine.step()
    llm.engine.offload_manager.reset_stats()
    steps = 0
    while engine.has_unfinished():
        assert engine.scheduler.prompt_pass is None and not engine.scheduler.waiting
        engine.step()
        steps += 1
    stats = llm.offload_stats()
    assert steps >= 20 and stats["calls"] == steps * stats["num_layers"]
    assert stats["staging_copies"] == 0 and stats["staging_bytes"] == 0
    assert 0 < stats["max_call_misses"] <= 4 * 2 < NUM_EXPERTS
    assert stats["overflow_misses"] > 0
    assert stats["bytes_copied"] == stats["misses"] * 3 * 64 * 32 * 4
    prefetched = stats["prefetch"]["prefetched_bytes"]  # prefetch is on by default
    assert stats["bytes_moved"] == stats["bytes_copied"] + prefetched
