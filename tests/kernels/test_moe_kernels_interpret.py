"""Triton MoE kernels (fused_moe, route_topk, silu_and_mul) run by Triton's CPU interpreter
against `kernels/reference.py`. fp32/fp16 are checked tightly; bf16 only loosely, because
the interpreter truncates bf16 casts (the GPU rounds to nearest) and cannot tl.dot bf16.

TRITON_INTERPRET must be set before the kernels are decorated and must not leak into GPU
tests of the same process, so in a normal run one test re-runs this file in a child pytest
with TRITON_INTERPRET=1, and the cases below run only there."""

from __future__ import annotations

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted

triton = pytest.importorskip("triton")


test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(scope="module")
def ml():
    from xinfer.kernels import moe_launch
    from xinfer.kernels.triton import fused_moe as moe_jit

    require_interpreted(moe_jit.moe_gate_up_gemv_kernel)
    return moe_launch


def _moe_inputs(num_tokens, top_k, hidden_dim, inter_dim, num_experts, dtype, seed=0):
    from xinfer.kernels import reference

    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_tokens, hidden_dim, generator=g).to(dtype)
    w13 = (torch.randn(num_experts, 2 * inter_dim, hidden_dim, generator=g) / hidden_dim**0.5).to(
        dtype
    )
    w2 = (torch.randn(num_experts, hidden_dim, inter_dim, generator=g) / inter_dim**0.5).to(dtype)
    logits = torch.randn(num_tokens, num_experts, generator=g)
    weights, ids = reference.route_topk(logits, top_k, renormalize=True)
    return hidden, ids, weights, w13, w2


SMALL_GROUPED = dict(block_m=16, block_n=16, block_k=16, num_warps=4)
PATHS = [
    pytest.param(True, None, id="gemv"),
    pytest.param(False, SMALL_GROUPED, id="grouped"),
]


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("use_gemv,cfg", PATHS)
def test_fused_moe_matches_reference(ml, dtype, use_gemv, cfg) -> None:
    from xinfer.kernels import reference

    # sizes off every block multiple; 5 tokens x 3 > 16 rows so some ids span two tiles
    args = _moe_inputs(5, 3, hidden_dim=37, inter_dim=19, num_experts=4, dtype=dtype)
    config = ml.MoeConfig(**cfg) if cfg else ml.gemv_config(15, 37, 19, dtype)
    out = ml.fused_moe(*args, config=config, use_gemv=use_gemv)
    ref = reference.fused_moe(*args)
    assert out.dtype == dtype and out.shape == ref.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-3  # fp16: at most an ulp or so of 0.5..2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


@child_only
@pytest.mark.parametrize("use_gemv,cfg", PATHS)
@pytest.mark.parametrize("num_slots", [4, 11])
def test_fused_moe_bits_do_not_depend_on_ids(ml, use_gemv, cfg, num_slots) -> None:
    """Expert ids on [E, ...] vs slot ids on a permuted [S, ...] set (S < E and S > E)."""
    num_experts, top_k, dtype = 7, 2, torch.float16
    hidden, _, weights, w13, w2 = _moe_inputs(6, top_k, 24, 20, num_experts, dtype, seed=1)
    g = torch.Generator().manual_seed(2)
    used = torch.randperm(num_experts, generator=g)[: min(num_slots, num_experts)]
    ids = used[torch.randint(0, len(used), (6, top_k), generator=g)].to(torch.int32)
    slot_of = torch.full((num_experts,), -1, dtype=torch.long)
    slot_of[used] = torch.randperm(num_slots, generator=g)[: len(used)]
    # slots not holding a used expert keep random (never zero) garbage
    w13_slots = torch.randn(num_slots, *w13.shape[1:], generator=g).to(dtype)
    w2_slots = torch.randn(num_slots, *w2.shape[1:], generator=g).to(dtype)
    w13_slots[slot_of[used]] = w13[used]
    w2_slots[slot_of[used]] = w2[used]
    slot_ids = slot_of[ids.long()].to(torch.int32)
    config = ml.MoeConfig(**cfg) if cfg else None
    out_e = ml.fused_moe(hidden, ids, weights, w13, w2, config=config, use_gemv=use_gemv)
    out_s = ml.fused_moe(hidden, slot_ids, weights, w13_slots, w2_slots, config, use_gemv)
    assert torch.equal(out_e, out_s)


@child_only
def test_fused_moe_on_a_slot_view_with_max_ids_has_the_same_bits(ml, monkeypatch) -> None:
    """The grouped path on a view of many rows (8 experts' rows among 1,100 of garbage):
    with the layer's expert count as `max_ids` (the align numbering the used rows) the
    output is the unbounded call's, bit for bit, and the expert set's; the plain weight
    format hands its `max_ids` down to the align."""
    from xinfer.quant.unquantized import Unquantized

    num_experts, top_k, num_tokens, rows = 8, 4, 20, 1100
    hidden, ids, weights, w13, w2 = _moe_inputs(num_tokens, top_k, 24, 20, num_experts,
                                                torch.float32, seed=9)  # fmt: skip
    g = torch.Generator().manual_seed(10)
    slot_of = torch.randperm(rows, generator=g)[:num_experts]
    v13 = torch.randn(rows, *w13.shape[1:], generator=g)
    v2 = torch.randn(rows, *w2.shape[1:], generator=g)
    v13[slot_of], v2[slot_of] = w13, w2
    slot_ids = slot_of[ids.long()].to(torch.int32)
    config = ml.MoeConfig(**SMALL_GROUPED)
    run = dict(config=config, use_gemv=False)
    bounded = ml.fused_moe(hidden, slot_ids, weights, v13, v2, max_ids=num_experts, **run)
    unbounded = ml.fused_moe(hidden, slot_ids, weights, v13, v2, **run)
    assert torch.equal(bounded, unbounded)
    assert torch.equal(bounded, ml.fused_moe(hidden, ids, weights, w13, w2, **run))

    from xinfer.kernels import moe_align

    seen, align = [], moe_align.align_pairs
    monkeypatch.setattr(moe_align, "align_pairs", lambda *a, **k: seen.append(k) or align(*a, **k))
    fmt = Unquantized(torch.float32)  # its default tiles: the grouped path at 80 pairs
    out = fmt.triton_moe(hidden, slot_ids, weights, {"weight": v13}, {"weight": v2}, 20,
                         max_ids=num_experts)  # fmt: skip
    assert seen[-1]["max_ids"] == num_experts
    assert torch.equal(out, ml.fused_moe(hidden, slot_ids, weights, v13, v2))


@child_only
@pytest.mark.parametrize("view_rows", [None, 300])
def test_fused_moe_grouped_bits_do_not_depend_on_the_align_method(ml, monkeypatch, view_rows):
    """The grouped path end to end with each align method (the counting sort, the torch
    sort, the one-program kernel) gives the same bits; on a slot view (the layer's 16
    experts among 300 rows, `max_ids` 16) the counting sort's shorter outputs too."""
    num_experts, top_k, num_tokens = 16, 4, 70
    hidden, ids, weights, w13, w2 = _moe_inputs(num_tokens, top_k, 40, 24, num_experts,
                                                torch.float32, seed=11)  # fmt: skip
    max_ids = None
    if view_rows:
        g = torch.Generator().manual_seed(12)
        slot_of = torch.randperm(view_rows, generator=g)[:num_experts]
        v13 = torch.randn(view_rows, *w13.shape[1:], generator=g)
        v2 = torch.randn(view_rows, *w2.shape[1:], generator=g)
        v13[slot_of], v2[slot_of] = w13, w2
        ids, w13, w2, max_ids = slot_of[ids.long()].to(torch.int32), v13, v2, num_experts
    from xinfer.kernels import moe_align

    align, outs = moe_align.align_pairs, {}
    run = dict(use_gemv=False, config=ml.MoeConfig(**SMALL_GROUPED), max_ids=max_ids)
    for method in ("count", "sort", "kernel"):
        forced = lambda *a, m=method, **k: align(*a, **k, method=m)  # noqa: E731
        monkeypatch.setattr(moe_align, "align_pairs", forced)
        outs[method] = ml.fused_moe(hidden, ids, weights, w13, w2, **run)
    assert torch.equal(outs["count"], outs["sort"]) and torch.equal(outs["count"], outs["kernel"])


@child_only
@pytest.mark.parametrize("num_experts,top_k", [(37, 4), (512, 8), (8, 8)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_topk_matches_reference(ml, num_experts, top_k, renormalize) -> None:
    from xinfer.kernels import reference

    logits = torch.randn(5, num_experts, generator=torch.Generator().manual_seed(num_experts))
    weights, ids = ml.route_topk(logits, top_k, renormalize)
    ref_w, ref_ids = reference.route_topk(logits, top_k, renormalize)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-6, atol=1e-6)


@child_only
def test_route_topk_ties_take_lowest_index(ml) -> None:
    logits = torch.tensor([[0.5, 2.0, 2.0, 1.0, 2.0]])
    _, ids = ml.route_topk(logits, 3, renormalize=False)
    assert ids.tolist() == [[1, 2, 4]]


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_and_mul_matches_reference(ml, dtype) -> None:
    from xinfer.kernels import reference

    x = (torch.randn(2, 3, 2 * 1100, generator=torch.Generator().manual_seed(3)) * 3).to(dtype)
    out = ml.silu_and_mul(x)
    assert out.shape == (2, 3, 1100) and out.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(out.float(), reference.silu_and_mul(x).float(), rtol=tol, atol=tol)


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sigmoid_gated_add_matches_reference(ml, dtype) -> None:
    """A MoE block's routed output + sigmoid(gate) * shared expert, rounded op by op as the
    reference (three torch ops) rounds; H off the block size, a strided gate column."""
    from xinfer.kernels import reference

    g = torch.Generator().manual_seed(6)
    base, x = (torch.randn(5, 1100, generator=g).to(dtype) for _ in range(2))
    gate = (torch.randn(5, 3, generator=g) * 3).to(dtype)[:, 1:2]  # a (T, 1) column view
    out = ml.sigmoid_gated_add(base, gate, x)
    assert out.shape == base.shape and out.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    want = reference.sigmoid_gated_add(base, gate, x)
    torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol)
    with pytest.raises(ValueError):
        ml.sigmoid_gated_add(base, gate.to(torch.float64), x)


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sigmoid_gated_add_computing_its_gate_matches_the_twin(ml, dtype) -> None:
    """With the gate linear's weight, the kernel computes the gate from its input: equal to
    the twin (the linear, then the three ops) up to the gate's summation order; a row's bits
    are the same alone as in the batch; K off the chunk size."""
    from xinfer.kernels import reference

    g = torch.Generator().manual_seed(7)
    base, x = (torch.randn(5, 1100, generator=g).to(dtype) for _ in range(2))
    gate_in = torch.randn(5, 1300, generator=g).to(dtype)
    gate_w = (torch.randn(1, 1300, generator=g) / 12).to(dtype)
    out = ml.sigmoid_gated_add(base, gate_in, x, gate_weight=gate_w)
    want = reference.sigmoid_gated_add(base, reference.linear(gate_in, gate_w), x)
    tol = 1e-5 if dtype == torch.float32 else 3e-3
    torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol)
    alone = ml.sigmoid_gated_add(base[2:3], gate_in[2:3], x[2:3], gate_weight=gate_w)
    assert torch.equal(alone[0], out[2])
    with pytest.raises(ValueError):
        ml.sigmoid_gated_add(base, gate_in, x, gate_weight=gate_w.T.contiguous())


@child_only
def test_bf16_runs_close_to_reference(ml) -> None:
    """bf16 through the interpreter (GEMV path, routing, activation): truncating casts make it
    a few bf16 ulps off, so this only guards against gross errors; the GPU tests are exact."""
    from xinfer.kernels import reference

    args = _moe_inputs(3, 2, 40, 24, 5, torch.bfloat16)
    out = ml.fused_moe(*args, use_gemv=True)
    ref = reference.fused_moe(*args)
    assert (out.float() - ref.float()).norm() <= 3e-2 * ref.float().norm()
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    assert (ml.silu_and_mul(x).float() - reference.silu_and_mul(x).float()).abs().max() < 5e-2
    # distinct logits: bf16 random data has exact ties, and torch.topk on CPU does not
    # promise the lowest index first on ties (the kernel does)
    perm = torch.randperm(50, generator=torch.Generator().manual_seed(5)).view(2, 25)
    logits = (perm * 0.05 - 1.2).to(x.dtype)
    _, ids = ml.route_topk(logits, 3, renormalize=True)
    assert torch.equal(ids, reference.route_topk(logits, 3, renormalize=True)[1])


@child_only
def test_bad_inputs_raise(ml) -> None:
    hidden, ids, weights, w13, w2 = _moe_inputs(2, 2, 16, 8, 3, torch.float32)
    with pytest.raises(ValueError):
        ml.fused_moe(hidden.half(), ids, weights, w13, w2)
    with pytest.raises(ValueError):
        ml.fused_moe(hidden, ids, weights, w13, w2[:, :, :4])
    with pytest.raises(ValueError):
        ml.route_topk(torch.randn(2, 4), 5, renormalize=True)
    with pytest.raises(ValueError):
        ml.silu_and_mul(torch.randn(2, 5))
