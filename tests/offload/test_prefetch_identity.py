"""Prefetch never changes output: for each architecture's tiny checkpoint (6 layers, 16
experts, top-2), greedy tokens of several prompts (batched decode wider than the slots,
and a prompt long enough to run as a prompt pass) are identical with prefetch off and on
(one and two layers ahead) at 2, 4 and 8 of 16 slots, and equal to no offload — with the
router's predictor, and with the routing model as source and its own predictor. The
prefetch statistics add up and the predictors really prefetched (and were used)."""

from __future__ import annotations

import pytest
from tiny_models import ARCHS, make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
NUM_EXPERTS = 16
BUDGET = 16  # the 17-token prompt runs as a prompt pass
PROMPTS = prompts(3, seed=1)  # 5, 17 and 9 tokens
SETTINGS = [(0.125, 1), (0.25, 1), (0.25, 2), (0.5, 1)]  # (fraction, prefetch distance)


def _run(path, **kw) -> tuple[list[list[int]], dict | None]:
    llm = LLM(str(path), device="cpu", max_num_batched_tokens=BUDGET, **kw)
    tokens = [r.token_ids for r in llm.generate(PROMPTS, GREEDY)]
    return tokens, llm.offload_stats()


def check_prefetch_stats(stats: dict) -> dict:
    pf = stats["prefetch"]
    assert pf["predicted"] == pf["present"] + pf["prefetched"] + pf["dropped"]
    assert pf["prefetched"] == pf["used"] + pf["wasted"] + pf["pending"] and pf["pending"] >= 0
    expert_bytes = stats["bytes_copied"] // max(1, stats["misses"])
    assert pf["prefetched_bytes"] == pf["prefetched"] * expert_bytes
    assert pf["used_bytes"] + pf["wasted_bytes"] <= pf["prefetched_bytes"]
    assert stats["bytes_moved"] == (
        stats["bytes_copied"] + stats["staging_bytes"] + pf["prefetched_bytes"]
    )
    for layer in stats["layers"][: pf["distance"]]:  # nothing predicts the first layers
        assert layer["prefetch"]["predicted"] == 0
    return pf


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(request, tmp_path_factory):
    arch = request.param
    key = "num_local_experts" if arch == "mixtral" else "num_experts"
    model = make_hf_model(arch, seed=3, num_hidden_layers=6, **{key: NUM_EXPERTS})
    return arch, write_checkpoint(model, tmp_path_factory.mktemp(arch))


def test_router_prefetch_keeps_output(checkpoint):
    arch, path = checkpoint
    base, _ = _run(path)
    for fraction, distance in SETTINGS:
        off, stats_off = _run(path, moe_offload=fraction, moe_prefetch=0)
        on, stats = _run(path, moe_offload=fraction, moe_prefetch=distance, moe_prefetch_margin=0)
        assert off == base and on == base, f"{arch}: output changed at {fraction}/{distance}"
        assert "prefetch" not in stats_off
        pf = check_prefetch_stats(stats)
        assert pf["predictor"] == "router" and pf["distance"] == distance
        assert pf["predicted"] > 0, arch


def test_routing_model_prefetch_keeps_output_and_is_used(tmp_path):
    """The routing model's predictor: same tokens, and most prefetched experts are used."""
    model = make_hf_model("mixtral", seed=3, num_hidden_layers=6, num_local_experts=NUM_EXPERTS)
    path = write_checkpoint(model, tmp_path)
    source = dict(routing_source="qwen3-30b-a3b", load_format="dummy")
    base, _ = _run(path, **source)
    for fraction, distance in SETTINGS:
        on, stats = _run(path, moe_offload=fraction, moe_prefetch=distance, **source)
        assert on == base, f"output changed at {fraction}/{distance}"
        pf = check_prefetch_stats(stats)
        assert pf["predictor"] == "routing-model"
        assert pf["prefetched"] > 0 and pf["used"] > pf["wasted"], pf


def test_lfu_prefetch_keeps_output_and_is_used(tmp_path):
    """Prefetch beside `lfu` slots (the reservation ranks and admits by the counts): same
    tokens as no offload, with the router's predictor and with the routing model's."""
    model = make_hf_model("qwen3_moe", seed=3, num_hidden_layers=6, num_experts=NUM_EXPERTS)
    path = write_checkpoint(model, tmp_path)
    source = dict(routing_source="qwen3-30b-a3b", load_format="dummy")
    for extra, predictor in (({}, "router"), (source, "routing-model")):
        base, _ = _run(path, **extra)
        for fraction, distance in [(0.125, 1), (0.25, 2)]:
            on, stats = _run(
                path,
                moe_offload=fraction,
                moe_offload_policy="lfu",
                moe_prefetch=distance,
                moe_prefetch_margin=0,
                **extra,
            )
            assert on == base, f"{predictor}: output changed at {fraction}/{distance}"
            assert stats["policy"] == "lfu"
            pf = check_prefetch_stats(stats)
            assert pf["predictor"] == predictor and pf["prefetched"] > 0, pf
            if predictor == "routing-model":
                assert pf["used"] > 0, pf


def test_prefetch_is_on_by_default_with_offload(tmp_path):
    """With offload and no --moe-prefetch, prefetch runs DEFAULT_PREFETCH_DISTANCE layers
    ahead (same tokens); --moe-prefetch 0 turns it off; without offload nothing prefetches;
    a routing source with no predictor (a replayed trace) runs without it, where a distance
    given is refused."""
    from xinfer.config import DEFAULT_PREFETCH_DISTANCE
    from xinfer.errors import UserError

    model = make_hf_model("qwen3_moe", seed=3, num_hidden_layers=6, num_experts=NUM_EXPERTS)
    path = write_checkpoint(model, tmp_path)
    base, none = _run(path)
    assert none is None
    on, stats = _run(path, moe_offload=0.25)
    off, stats_off = _run(path, moe_offload=0.25, moe_prefetch=0)
    assert on == off == base
    pf = check_prefetch_stats(stats)
    assert pf["distance"] == DEFAULT_PREFETCH_DISTANCE == 2 and pf["predictor"] == "router"
    assert "prefetch" not in stats_off
    trace = tmp_path / "routing.jsonl"
    recorder = LLM(
        str(path), device="cpu", max_num_batched_tokens=BUDGET, record_routing=str(trace)
    )
    recorder.generate(PROMPTS, GREEDY)
    replayed, stats = _run(path, moe_offload=0.25, routing_source=f"replay:{trace}")
    assert replayed == base and "prefetch" not in stats
    with pytest.raises(UserError, match="no predictor for a replayed routing trace"):
        LLM(str(path), device="cpu", moe_offload=0.25, moe_prefetch=1,
            routing_source=f"replay:{trace}")  # fmt: skip


def test_prefetch_without_offload_is_refused(checkpoint):
    """Nothing is accepted and ignored: prefetch with no expert offload is one clear error."""
    from xinfer.errors import UserError

    with pytest.raises(UserError, match="--moe-prefetch .* needs MoE expert offload"):
        LLM(str(checkpoint[1]), device="cpu", moe_prefetch=1)


def test_issue_point_changes_neither_output_nor_decisions(tmp_path, monkeypatch):
    """Prefetch issued before a layer's lookup or after its demand fill
    (--moe-prefetch-issue): each layer's table and slots are its own, so the same tokens and
    the same counts — hits, misses, every prefetch statistic, per layer."""
    model = make_hf_model("qwen3_moe", seed=3, num_hidden_layers=6, num_experts=NUM_EXPERTS)
    path = write_checkpoint(model, tmp_path)
    runs = {}
    for after_fill in (False, True):
        issue = "after-fill" if after_fill else "before-lookup"
        runs[after_fill] = _run(path, moe_offload=0.25, moe_prefetch=1, moe_prefetch_margin=0,
                                moe_prefetch_issue=issue)  # fmt: skip
    (tokens_before, stats_before), (tokens_after, stats_after) = runs[False], runs[True]
    assert tokens_before == tokens_after
    check_prefetch_stats(stats_after)
    assert stats_after["prefetch"]["prefetched"] > 0
    for key in ("hits", "misses", "bytes_copied", "prefetch", "layers"):
        assert stats_before[key] == stats_after[key], key
