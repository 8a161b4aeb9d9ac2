"""The prefetch kernels (`kernels/triton/prefetch.py`) in Triton's CPU interpreter against
their twins: `reserve_kernel` on adversarial prediction streams interleaved with lookups
(tables, copy lists, counters, and the prefetch fill through the unchanged fill kernel),
`select_kernel` on random and tied scores with padding rows, `predict_model_kernel` on a
decode batch whose state rows continue, repeat, belong to another request or are empty.
Expert counts that are not powers of two, id lists longer than one block.

TRITON_INTERPRET must be set before the kernels are decorated, so in a normal run one test
re-runs this file in a child pytest with TRITON_INTERPRET=1, and the cases run only there."""

from __future__ import annotations

import random

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted
from lru_model import random_expert_set, routing_stream
from prefetch_model import prediction_for

from xinfer.offload import kernels as offload_kernels
from xinfer.offload.lookup import fill_reference, lookup_reference
from xinfer.offload.predictor import select, select_reference
from xinfer.offload.prefetch_table import PrefetchTable, reserve, reserve_reference
from xinfer.offload.slot_cache import SlotCache
from xinfer.routing.config import PRESETS
from xinfer.routing.parametric import popularity_draw
from xinfer.routing.parametric_ops import RoutingState, SequenceBatch, layer_constants
from xinfer.routing.predict import predict_model, predict_model_reference

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def interpreted():
    from xinfer.kernels.triton import prefetch as jit

    require_interpreted(jit.reserve_kernel)


@child_only
@pytest.mark.parametrize(
    ("num_experts", "num_slots", "top_k", "policy"),
    [
        (8, 2, 2, "lru"),
        (20, 7, 3, "lru"),
        (70, 24, 8, "lru"),
        (20, 7, 3, "lfu"),
        (70, 24, 8, "lfu"),
    ],
)
def test_reserve_kernel_equals_twin(interpreted, num_experts, num_slots, top_k, policy):
    host = random_expert_set(num_experts, seed=num_experts)
    caches = [SlotCache(host, num_slots, CPU, policy=policy) for _ in range(2)]
    ref, tri = (PrefetchTable(c) for c in caches)
    rng = random.Random(num_slots)
    for step, ids in enumerate(routing_stream(rng, num_experts, num_slots, top_k, 30, 12)):
        pred = prediction_for(rng, ids, num_experts)
        reserve_reference(ref, pred)
        reserve(tri, pred, force_triton=True, num_warps=1 + 3 * (step % 2))
        fill_reference(ref.fill_target(), host)
        offload_kernels.fill(tri.fill_target(), host, force_triton=True, num_programs=3, block=4)
        where = f"E={num_experts} S={num_slots} call {step}"
        for name, value in ref.cache.state().items():
            assert torch.equal(tri.cache.state()[name], value), (where, name)
        n = int(ref.miss_count)
        assert int(tri.miss_count) == n, where
        assert torch.equal(tri.miss_ids[:n], ref.miss_ids[:n]), where
        assert torch.equal(tri.miss_slots[:n], ref.miss_slots[:n]), where
        assert torch.equal(tri.pending, ref.pending) and torch.equal(tri.stamp, ref.stamp)
        assert torch.equal(tri.counters, ref.counters), where
        for s, e in enumerate(tri.cache.expert_of_slot.tolist()):
            for name, t in host.items():
                assert e < 0 or torch.equal(tri.cache.slots[name][s], t[e]), (where, s)
        for table in (ref, tri):  # the same lookup on both: the next settle sees its stamps
            lookup_reference(table.cache, ids)
            fill_reference(table.cache, host)
    assert int(ref.counters.sum()) > 0


@child_only
@pytest.mark.parametrize(("num_experts", "top_k", "margin"), [(20, 3, 0.0), (130, 8, 0.5)])
def test_select_kernel_equals_twin(interpreted, num_experts, top_k, margin):
    g = torch.Generator().manual_seed(num_experts)
    scores = torch.randn(9, num_experts, generator=g)
    scores[3] = scores[3].to(torch.bfloat16).float().round()  # many ties
    keys = torch.tensor([0, 1, -1, 3, 4, 5, -1, 7, 8], dtype=torch.int64)
    for k in (keys, None):
        want = select_reference(scores, top_k, margin, k)
        got = select(scores, top_k, margin, k, force_triton=True)
        assert torch.equal(got, want), (got, want)
    bf16 = scores.to(torch.bfloat16)
    assert torch.equal(select(bf16, top_k, margin, force_triton=True),
                       select_reference(bf16, top_k, margin))  # fmt: skip
    every = select(scores, num_experts, margin, force_triton=True)  # k = E: no (k+1)-th
    assert torch.equal(every, select_reference(scores, num_experts, margin))
    assert int(every.min()) >= 0


@child_only
@pytest.mark.parametrize("num_experts", [20, 130])
def test_predict_model_kernel_equals_twin(interpreted, num_experts):
    g = torch.Generator().manual_seed(5)
    state = RoutingState.empty(6, num_experts, CPU)
    state.c.copy_(torch.randn(7, num_experts, generator=g))
    for row, (key, pos) in enumerate([(10, 6), (11, 12), (99, 3), (-1, -1), (14, 40), (15, 0)]):
        state.key[row], state.pos[row] = key, pos
    # decode tokens: (row, key, position) — continues, repeats, other key, empty, padding
    toks = [(0, 10, 7), (1, 11, 12), (2, 12, 4), (3, 13, 0), (6, -1, 0), (4, 14, 41)]
    batch = SequenceBatch(
        torch.arange(len(toks) + 1, dtype=torch.int32),
        torch.tensor([p + 1 for *_, p in toks], dtype=torch.int32),
        torch.tensor([r for r, *_ in toks], dtype=torch.int64),
        torch.tensor([k for _, k, _ in toks], dtype=torch.int64),
        True,
    )
    params = PRESETS["qwen3-30b-a3b"]
    const = layer_constants(3, 4, params.layer_scale(4), params.sigma, params.tau, params.phi,
                            popularity_draw(3, 4, num_experts))  # fmt: skip
    for blur, margin in ((0.0, 0.0), (0.7, 0.5)):
        want = predict_model_reference(state, batch, const, 1234, blur, 8, margin)
        got = predict_model(state, batch, const, 1234, blur, 8, margin, force_triton=True)
        assert torch.equal(got, want), (blur, got, want)
    assert (want[4] == -1).all() and (want[[0, 1, 2, 3, 5]] >= 0).any()
