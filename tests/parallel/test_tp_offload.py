"""Offload per rank under tensor parallelism (2 CPU ranks, gloo): each rank's host store
holds its shard of every expert (so a miss moves half the bytes), its slots and counters are
its own, `auto` sizes each rank from its own memory, and greedy output stays byte-identical
for every offload setting — and equal to one rank without offload."""

from __future__ import annotations

import pytest
import tiny_models as tm
from tp_checkpoints import checkpoint

from xinfer import LLM, SamplingParams

GIB = 1 << 30
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
PROMPTS = tm.prompts(3, seed=1)  # 5, 17 and 9 tokens: wide prefills stage, decode fills


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return checkpoint(tmp_path_factory, "qwen3_moe", num_experts=16)  # MoE layers 0 and 2


@pytest.fixture(scope="module")
def one_rank(path):
    """TP=1 tokens without offload, and TP=1 stats at 0.25."""
    tokens = [r.token_ids for r in LLM(str(path), device="cpu").generate(PROMPTS, GREEDY)]
    llm = LLM(str(path), device="cpu", moe_offload=0.25)
    llm.generate(PROMPTS, GREEDY)
    return tokens, llm.offload_stats()


def _generate(llm: LLM) -> list[list[int]]:
    return [r.token_ids for r in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("fraction", [None, 0.25, 1.0])
def test_tp2_output_identical_across_fractions(path, one_rank, tp_llm, fraction):
    llm = tp_llm(path, dtype=None, moe_offload=fraction)
    assert _generate(llm) == one_rank[0], f"TP=2 output changed at offload {fraction}"
    stats = llm.offload_stats()
    if fraction is None:
        assert stats is None
        return
    assert stats["tp_size"] == 2 and len(stats["ranks"]) == 2
    r0, r1 = stats["ranks"]
    assert r0["slots_per_layer"] == r1["slots_per_layer"] == [round(16 * fraction)] * 2
    # the router is replicated and the all-reduce gives every rank the same bits: both
    # ranks route alike, so their caches see the same hits and misses
    assert (r0["hits"], r0["misses"], r0["calls"]) == (r1["hits"], r1["misses"], r1["calls"])
    assert stats["hits"] == 2 * r0["hits"] and stats["bytes_moved"] == 2 * r0["bytes_moved"]
    if fraction == 0.25:  # prefills wider than the 4 slots take overflow rows
        assert r0["misses"] > 0 and r0["overflow_misses"] > 0


def test_bytes_per_miss_divide_by_tp_size(path, one_rank, tp_llm):
    _, single = one_rank
    llm = tp_llm(path, dtype=None, moe_offload=0.25)
    _generate(llm)
    rank = llm.offload_stats()["ranks"][0]
    per_miss_1 = single["bytes_copied"] / single["misses"]
    per_miss_2 = rank["bytes_copied"] / rank["misses"]
    assert per_miss_2 * 2 == per_miss_1
    assert rank["pinned_gb"] * 2 == pytest.approx(single["pinned_gb"])


def test_auto_sizes_each_rank_from_its_own_memory(tmp_path_factory, tp_llm):
    """The same memory limit per rank holds more slots of a half-width shard."""
    path = checkpoint(tmp_path_factory, "qwen3_moe", num_experts=16, mlp_only_layers=[])
    model = LLM(str(path), device="cpu").engine.model
    resident = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    expert = 3 * 64 * 32 * 4  # bytes of one float32 expert on one rank
    options = dict(moe_offload="auto", moe_offload_reserve_gb=0.0)
    # S slots in each of 3 layers plus 2 shared regions of 16 - S rows: (S + 32) experts;
    # one rank: 40 experts' room → 8 slots, or with one stream buffer (2 S + 16) 12, which
    # `auto` takes (1.5x); half-width shards: all 16 fit (48 halves)
    options["gpu_memory_limit_gb"] = (resident + 40 * expert) / GIB
    single = LLM(str(path), device="cpu", **options)
    expected = _generate(single)
    assert single.offload_stats()["slots_per_layer"] == [12, 12, 12]
    llm = tp_llm(path, dtype=None, **options)
    assert _generate(llm) == expected
    assert [r["slots_per_layer"] for r in llm.offload_stats()["ranks"]] == [[16] * 3] * 2


def test_routing_model_routes_alike_on_every_rank(path, tp_llm):
    """The benchmarks' routing model (dummy weights) is computed on every rank from the same
    broadcast request rows and keys, and reset after rank 0's warm-up on every rank: TP=2
    routes, and so decodes, as TP=1, and both ranks see the same hits and misses."""
    options = dict(load_format="dummy", routing_source="model:2.0,2.0,0.98", moe_offload=0.25)
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=24, ignore_eos=True)
    one = LLM(str(path), device="cpu", **options)
    expected = [r.token_ids for r in one.generate(PROMPTS, params)]
    llm = tp_llm(path, dtype=None, **options)
    assert [r.token_ids for r in llm.generate(PROMPTS, params)] == expected
    r0, r1 = llm.offload_stats()["ranks"]
    assert (r0["hits"], r0["misses"]) == (r1["hits"], r1["misses"])
    assert r0["misses"] == one.offload_stats()["misses"]


def test_tp2_packed_experts_keep_output(path, tp_llm):
    """`--moe-offload-compress` per rank: each rank packs its bf16 shards; the tokens of the
    same TP=2 engine with plain experts, and each rank moves 3/4 of its plain bytes a miss
    (one tensor-parallel engine at a time in a process: each closed before the next)."""
    plain = tp_llm(path, dtype="bfloat16", moe_offload=0.25)
    want, plain_stats = _generate(plain), plain.offload_stats()
    plain.close()
    llm = tp_llm(path, dtype="bfloat16", moe_offload=0.25, moe_offload_compress=True)
    assert _generate(llm) == want
    stats = llm.offload_stats()
    assert stats["compressed"] and not plain_stats["compressed"]
    for rank, plain_rank in zip(stats["ranks"], plain_stats["ranks"]):
        assert rank["misses"] == plain_rank["misses"] > 0
        assert 0.7 < rank["bytes_copied"] / plain_rank["bytes_copied"] < 0.8
