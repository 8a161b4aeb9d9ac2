"""The tested guarantee: greedy output is byte-identical for every offload setting. For
each architecture's tiny checkpoint, 64 greedy tokens of several prompts, batched and one
at a time, through `xinfer.LLM` on CPU, for offload unset, 0.1, 0.25, 0.5 and 1.0 (16
experts: 2, 4, 8 and 16 slots per layer; 16 = every expert, which runs resident); wide
prefills go through the staging path and decode through lookup/fill."""

from __future__ import annotations

import pytest
from tiny_models import ARCHS, make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams

FRACTIONS = [None, 0.1, 0.25, 0.5, 1.0]
GREEDY = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
NUM_EXPERTS = 16
PROMPTS = prompts(3, seed=1)  # 5, 17 and 9 tokens
SINGLE = PROMPTS[:2]  # each alone


@pytest.fixture(scope="module", params=sorted(ARCHS))
def outputs(request, tmp_path_factory):
    """arch → {fraction: (batched outputs, single outputs, stats)}, one checkpoint each."""
    arch = request.param
    key = "num_local_experts" if arch == "mixtral" else "num_experts"
    model = make_hf_model(arch, seed=3, **{key: NUM_EXPERTS})
    path = write_checkpoint(model, tmp_path_factory.mktemp(arch))
    results = {}
    for fraction in FRACTIONS:
        llm = LLM(str(path), device="cpu", moe_offload=fraction)
        batched = [r.token_ids for r in llm.generate(PROMPTS, GREEDY)]
        single = [llm.generate(p, GREEDY)[0].token_ids for p in SINGLE]
        results[fraction] = (batched, single, llm.offload_stats())
    return arch, results


@pytest.mark.parametrize("fraction", FRACTIONS[1:])
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


def test_wide_prefill_uses_staging_and_matches(outputs):
    """With 2 or 4 of 16 experts per layer, prefills touch more experts than there are
    slots: they went through the staging copy, and the outputs above still matched."""
    arch, results = outputs
    for fraction, slots in ((0.1, 2), (0.25, 4), (0.5, 8), (1.0, 16)):
        assert set(results[fraction][2]["slots_per_layer"]) == {slots}
    for fraction in (0.1, 0.25):
        stats = results[fraction][2]
        assert stats["staging_copies"] > 0 and stats["staging_bytes"] > 0, arch
    assert results[1.0][2]["staging_copies"] == 0  # every expert fits: never staged
    assert results[0.5][2]["misses"] > 0
