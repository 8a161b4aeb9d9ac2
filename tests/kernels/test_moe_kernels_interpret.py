"""Triton MoE kernels (fused_moe, route_topk, silu_and_mul) run by Triton's CPU interpreter
against `kernels/reference.py`. fp32/fp16 are checked tightly; bf16 only loosely, because
the interpreter truncates bf16 casts (the GPU rounds to nearest) and cannot tl.dot bf16.

TRITON_INTERPRET must be set before the kernels are decorated and must not leak into GPU
tests of the same process, so in a normal run one test re-runs this file in a child pytest
with TRITON_INTERPRET=1, and the cases below run only there."""

from __future__ import annotations

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test

triton = pytest.importorskip("triton")


test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(scope="module")
def ml():
    from triton.runtime.interpreter import InterpretedFunction

    from xinfer.kernels import moe_launch
    from xinfer.kernels.triton import fused_moe as moe_jit

    if not isinstance(moe_jit.moe_gate_up_gemv_kernel, InterpretedFunction):
        pytest.skip("kernels were compiled before TRITON_INTERPRET=1 was set in this process")
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


ALIGN_METHODS = pytest.mark.parametrize("method", ["kernel", "sort"])


@child_only
@ALIGN_METHODS
def test_align_pairs_sorts_stably_and_pads(ml, method) -> None:
    ids = torch.tensor([[3, 0], [0, 3], [5, 0], [0, 1]], dtype=torch.int32)
    sorted_pairs, block_ids, num_rows = ml.align_pairs(ids, num_ids=6, block_m=4, method=method)
    pad = ids.numel()
    expect = [1, 2, 5, 6, 7, pad, pad, pad, 0, 3, pad, pad, 4, pad, pad, pad]  # ids 0, 1, 3, 5
    assert sorted_pairs[: len(expect)].tolist() == expect
    assert (sorted_pairs[len(expect) :] == pad).all()
    assert block_ids[:4].tolist() == [0, 1, 3, 5] and num_rows.tolist() == [16]


@child_only
@ALIGN_METHODS
@pytest.mark.parametrize("num_ids,num_pairs,block_m", [(5, 40, 16), (300, 70, 4), (9, 1, 64)])
def test_align_pairs_matches_torch_sort(ml, num_ids, num_pairs, block_m, method) -> None:
    ids = torch.randint(0, num_ids, (num_pairs, 1), generator=torch.Generator().manual_seed(6))
    sorted_pairs, block_ids, num_rows = ml.align_pairs(
        ids.to(torch.int32), num_ids, block_m, method=method
    )
    order = torch.sort(ids.view(-1), stable=True).indices
    rows = sorted_pairs[sorted_pairs < num_pairs]
    assert torch.equal(rows.long(), order)  # stable order once the padding is dropped
    counts = torch.bincount(ids.view(-1), minlength=num_ids)
    padded = (counts + block_m - 1) // block_m * block_m
    assert num_rows.item() == padded.sum().item()
    tile_ids = torch.repeat_interleave(torch.arange(num_ids), padded // block_m)
    assert torch.equal(block_ids[: len(tile_ids)].long(), tile_ids)
    for tile, e in enumerate(tile_ids.tolist()):  # each tile: its id's pairs, then padding
        pairs = sorted_pairs[tile * block_m : (tile + 1) * block_m]
        assert (ids.view(-1)[pairs[pairs < num_pairs].long()] == e).all()


@child_only
@ALIGN_METHODS
def test_align_pairs_leaves_out_negative_ids(ml, method) -> None:
    ids = torch.randint(-1, 5, (50, 1), generator=torch.Generator().manual_seed(7))
    ids[0] = -1  # at least one left out, and one kept id after it in the same chunk
    ids[1] = 2
    sorted_pairs, block_ids, num_rows = ml.align_pairs(
        ids.to(torch.int32), 5, block_m=8, method=method
    )
    flat = ids.view(-1)
    kept = torch.nonzero(flat >= 0).view(-1)
    order = kept[torch.sort(flat[kept], stable=True).indices]
    rows = sorted_pairs[sorted_pairs < flat.numel()]
    assert torch.equal(rows.long(), order)  # exactly the kept pairs, stably sorted
    counts = torch.bincount(flat[kept], minlength=5)
    assert num_rows.item() == ((counts + 7) // 8 * 8).sum().item()


@child_only
@pytest.mark.parametrize(
    "num_ids,num_pairs,block_m", [(128, 600, 64), (1000, 333, 16), (7, 90, 8), (3, 5, 64)]
)
def test_align_pairs_sort_equals_kernel(ml, num_ids, num_pairs, block_m) -> None:
    """The two methods agree on every output element, padding and tiles past num_rows
    included (what the GEMMs read), with left-out pairs among the ids."""
    g = torch.Generator().manual_seed(num_ids + num_pairs)
    ids = torch.randint(-1, num_ids, (num_pairs,), generator=g).to(torch.int32)
    kernel = ml.align_pairs(ids, num_ids, block_m, method="kernel")
    sort = ml.align_pairs(ids, num_ids, block_m, method="sort")
    for a, b in zip(kernel, sort, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


# an offload slot view: layer 0's rows of Qwen3-30B-A3B at 67 slots, its layer's 128 experts
VIEW_ROWS, VIEW_EXPERTS = 3338, 128


def _view_ids(num_pairs: int, num_used: int, seed: int) -> torch.Tensor:
    """(num_pairs,) int32 ids of `num_used` random rows of the view, ~1/8 of them -1."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randperm(VIEW_ROWS, generator=g)[:num_used]
    ids = rows[torch.randint(0, num_used, (num_pairs,), generator=g)].to(torch.int32)
    ids[torch.randint(0, num_pairs, (num_pairs // 8,), generator=g)] = -1
    return ids


@child_only
@pytest.mark.parametrize(
    "num_pairs,block_m,num_used",
    [(65, 16, 128), (333, 64, 128), (1000, 64, 128), (4095, 16, 128), (200, 16, 3)],
)
def test_align_pairs_numbered_equals_unnumbered_and_sort(ml, num_pairs, block_m, num_used):
    """Decode batches of 9-511 sequences on a slot view of 3,338 rows with the layer's 128
    experts as `max_ids`: the ids numbered first give the unnumbered kernel's and the sort's
    outputs bit for bit (the tiles past num_rows too, as far as the shorter outputs go),
    from fewer rows (max_rows sized from the bound)."""
    ids = _view_ids(num_pairs, num_used, seed=num_pairs + block_m)
    numbered = ml.align_pairs(ids, VIEW_ROWS, block_m, method="kernel", max_ids=VIEW_EXPERTS)
    kernel = ml.align_pairs(ids, VIEW_ROWS, block_m, method="kernel")
    sort = ml.align_pairs(ids, VIEW_ROWS, block_m, method="sort")
    bound = min(num_pairs, VIEW_EXPERTS)
    assert numbered[0].numel() == triton.cdiv(num_pairs + bound * (block_m - 1), block_m) * block_m
    assert numbered[0].numel() <= kernel[0].numel()
    assert ml._numbered_bound(VIEW_ROWS, num_pairs, VIEW_EXPERTS) == bound  # it did number
    for a, b in zip(kernel, sort, strict=True):
        assert torch.equal(a, b)
    sorted_pairs, block_ids, num_rows = numbered
    assert torch.equal(num_rows, kernel[2])
    assert torch.equal(sorted_pairs, kernel[0][: sorted_pairs.numel()])
    assert torch.equal(block_ids, kernel[1][: block_ids.numel()])
    assert (sorted_pairs[num_rows.item() :] == num_pairs).all()  # padding past the rows used


class _GuardedTorch:
    """`torch` for `moe_launch` whose `empty` buffers have sentinel guards either side."""

    GUARD, SENTINEL = 4096, -7777  # the align kernel writes only values >= -1

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []

    def __getattr__(self, name):
        return getattr(torch, name)

    def empty(self, n: int, dtype: torch.dtype, device) -> torch.Tensor:
        buf = torch.full((n + 2 * self.GUARD,), self.SENTINEL, dtype=dtype, device=device)
        self.buffers.append(buf)
        return buf[self.GUARD : self.GUARD + n]

    def guards_intact(self) -> bool:
        g = self.GUARD
        return all((b[:g] == self.SENTINEL).all() and (b[-g:] == self.SENTINEL).all()
                   for b in self.buffers)  # fmt: skip


@child_only
@pytest.mark.parametrize("block_m", [16, 64])
def test_align_pairs_with_more_ids_than_promised_stays_in_its_buffers(ml, monkeypatch, block_m):
    """A broken promise (300 distinct ids, `max_ids` 128): the pairs of the ids numbered from
    128 on (the largest) are left out, the rest aligned as if those were -1, and no store
    lands outside the outputs and the scratch (sentinel guards around every buffer)."""
    num_pairs = 1500
    ids = _view_ids(num_pairs, 300, seed=block_m)
    assert torch.unique(ids[ids >= 0]).numel() > VIEW_EXPERTS
    guarded = _GuardedTorch()
    monkeypatch.setattr(ml, "torch", guarded)
    sorted_pairs, block_ids, num_rows = ml.align_pairs(
        ids, VIEW_ROWS, block_m, method="kernel", max_ids=VIEW_EXPERTS
    )
    monkeypatch.undo()
    assert len(guarded.buffers) == 4 and guarded.guards_intact()  # 3 outputs, 1 scratch
    kept = torch.unique(ids[ids >= 0])[:VIEW_EXPERTS]  # the 128 smallest used ids
    dropped = torch.where(torch.isin(ids, kept), ids, -1)
    want = ml.align_pairs(dropped, VIEW_ROWS, block_m, method="sort")
    assert num_rows.item() <= sorted_pairs.numel() and torch.equal(num_rows, want[2])
    assert torch.equal(sorted_pairs, want[0][: sorted_pairs.numel()])
    assert torch.equal(block_ids, want[1][: block_ids.numel()])


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

    seen, align = [], ml.align_pairs
    monkeypatch.setattr(ml, "align_pairs", lambda *a, **k: seen.append(k) or align(*a, **k))
    fmt = Unquantized(torch.float32)  # its default tiles: the grouped path at 80 pairs
    out = fmt.triton_moe(hidden, slot_ids, weights, {"weight": v13}, {"weight": v2}, 20,
                         max_ids=num_experts)  # fmt: skip
    assert seen[-1]["max_ids"] == num_experts
    assert torch.equal(out, ml.fused_moe(hidden, slot_ids, weights, v13, v2))


def test_align_pairs_picks_sort_for_many_pairs(monkeypatch) -> None:
    """Outside the interpreter: the default method follows the pair count only, and the
    sort path runs on plain torch (CPU here)."""
    from xinfer.kernels import moe_launch

    called = []
    real = moe_launch._align_by_sort
    monkeypatch.setattr(moe_launch, "_align_by_sort", lambda *a: called.append(a) or real(*a))
    ids = torch.randint(0, 1500, (moe_launch.SORT_ALIGN_PAIRS,), dtype=torch.int32)
    sorted_pairs, block_ids, num_rows = moe_launch.align_pairs(ids, 1500, 64)
    assert called and sorted_pairs.shape[0] % 64 == 0
    kept = sorted_pairs[sorted_pairs < ids.numel()].long()
    assert torch.equal(kept, torch.sort(ids.long(), stable=True).indices)
    with pytest.raises(ValueError, match="method"):
        moe_launch.align_pairs(ids, 1500, 64, method="radix")


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
