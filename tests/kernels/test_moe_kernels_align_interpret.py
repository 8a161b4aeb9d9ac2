"""`moe_align.align_pairs` run by Triton's CPU interpreter: its three methods ("kernel", the
one-program align; "count", the counting sort of `triton/moe_sort.py`; "sort", torch ops)
against a torch stable sort and against each other, bit for bit, on every output element
the GEMMs read; `max_ids` on an offload slot view; the default method's rule.

TRITON_INTERPRET must be set before the kernels are decorated, so in a normal run one test
re-runs this file in a child pytest with TRITON_INTERPRET=1 (`interpreter_child`), and the
`child_only` cases run only there."""

from __future__ import annotations

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted

triton = pytest.importorskip("triton")


test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(scope="module")
def ma():
    from xinfer.kernels import moe_align
    from xinfer.kernels.triton import fused_moe as moe_jit
    from xinfer.kernels.triton import moe_sort

    for fn in (moe_jit.moe_align_kernel, moe_sort.moe_count_kernel):
        require_interpreted(fn)
    return moe_align


ALIGN_METHODS = pytest.mark.parametrize("method", ["kernel", "count", "sort"])


@child_only
@ALIGN_METHODS
def test_align_pairs_sorts_stably_and_pads(ma, method) -> None:
    ids = torch.tensor([[3, 0], [0, 3], [5, 0], [0, 1]], dtype=torch.int32)
    sorted_pairs, block_ids, num_rows = ma.align_pairs(ids, num_ids=6, block_m=4, method=method)
    pad = ids.numel()
    expect = [1, 2, 5, 6, 7, pad, pad, pad, 0, 3, pad, pad, 4, pad, pad, pad]  # ids 0, 1, 3, 5
    assert sorted_pairs[: len(expect)].tolist() == expect
    assert (sorted_pairs[len(expect) :] == pad).all()
    assert block_ids[:4].tolist() == [0, 1, 3, 5] and num_rows.tolist() == [16]


@child_only
@ALIGN_METHODS
@pytest.mark.parametrize("num_ids,num_pairs,block_m", [(5, 40, 16), (300, 70, 4), (9, 1, 64)])
def test_align_pairs_matches_torch_sort(ma, num_ids, num_pairs, block_m, method) -> None:
    ids = torch.randint(0, num_ids, (num_pairs, 1), generator=torch.Generator().manual_seed(6))
    sorted_pairs, block_ids, num_rows = ma.align_pairs(
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
def test_align_pairs_leaves_out_negative_ids(ma, method) -> None:
    ids = torch.randint(-1, 5, (50, 1), generator=torch.Generator().manual_seed(7))
    ids[0] = -1  # at least one left out, and one kept id after it in the same chunk
    ids[1] = 2
    sorted_pairs, block_ids, num_rows = ma.align_pairs(
        ids.to(torch.int32), 5, block_m=8, method=method
    )
    flat = ids.view(-1)
    kept = torch.nonzero(flat >= 0).view(-1)
    order = kept[torch.sort(flat[kept], stable=True).indices]
    rows = sorted_pairs[sorted_pairs < flat.numel()]
    assert torch.equal(rows.long(), order)  # exactly the kept pairs, stably sorted
    counts = torch.bincount(flat[kept], minlength=5)
    assert num_rows.item() == ((counts + 7) // 8 * 8).sum().item()


def _ids(num_pairs: int, num_ids: int, seed: int) -> torch.Tensor:
    """(num_pairs,) int32 random ids in [0, num_ids), ~1/8 of them -1 (left out)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, num_ids, (num_pairs,), generator=g).to(torch.int32)
    ids[torch.randint(0, num_pairs, (num_pairs // 8,), generator=g)] = -1
    return ids


def _assert_same(got, want) -> None:
    """Every output element, padding and tiles past num_rows included (what the GEMMs read)."""
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


# (pairs, ids, block_m): every block_m up to 1,000 pairs; then block_m in turn. The count
# kernels' blocks are 128 pairs: 4,095 / 20,000 are not multiples; 4,095 x 3,338 takes the
# separate prefix launch, 16,384 x 128 sits on its threshold (ONE_PROGRAM_SCAN counts),
# 20,000 x 8 scans 157 blocks in one program
ALIGN_SIZES = [
    *[(p, n, m) for p in (1, 65, 1000) for n in (8, 128, 3338) for m in (16, 64, 128)],
    (4095, 8, 16), (4095, 128, 64), (4095, 3338, 128), (4096, 8, 128), (4096, 128, 16),
    (4096, 3338, 64), (16384, 128, 128), (20000, 8, 16),
]  # fmt: skip


@child_only
@pytest.mark.parametrize("num_pairs,num_ids,block_m", ALIGN_SIZES)
def test_align_pairs_methods_agree(ma, num_pairs, num_ids, block_m) -> None:
    """The counting sort == the torch sort == the one-program kernel on every output element,
    with left-out pairs among the ids (the kernel where the interpreter runs it in seconds:
    pairs x next_pow2(ids) <= 2^21)."""
    ids = _ids(num_pairs, num_ids, seed=num_pairs + num_ids + block_m)
    count = ma.align_pairs(ids, num_ids, block_m, method="count")
    _assert_same(count, ma.align_pairs(ids, num_ids, block_m, method="sort"))
    if num_pairs * triton.next_power_of_2(num_ids) <= 1 << 21:
        _assert_same(count, ma.align_pairs(ids, num_ids, block_m, method="kernel"))


@child_only
@pytest.mark.parametrize("num_pairs,value", [(1000, 77), (4097, 0), (300, 127)])
def test_align_pairs_methods_agree_when_all_ids_are_equal(ma, num_pairs, value) -> None:
    ids = torch.full((num_pairs, 1), value, dtype=torch.int32)
    sort = ma.align_pairs(ids, 128, 16, method="sort")
    assert sort[2].item() == triton.cdiv(num_pairs, 16) * 16
    for method in ("count", "kernel"):
        _assert_same(ma.align_pairs(ids, 128, 16, method=method), sort)


@child_only
@pytest.mark.parametrize("num_pairs", [0, 1, 300, 4096])
def test_align_pairs_methods_agree_when_every_pair_is_left_out(ma, num_pairs) -> None:
    """All ids negative (no pairs at all, too): no rows, all padding, every tile the last id."""
    ids = -torch.randint(1, 5, (num_pairs,), generator=torch.Generator().manual_seed(3))
    sort = ma.align_pairs(ids.to(torch.int32), 128, 64, method="sort")
    assert sort[2].item() == 0 and (sort[0] == num_pairs).all() and (sort[1] == 127).all()
    for method in ("count", "kernel"):
        _assert_same(ma.align_pairs(ids.to(torch.int32), 128, 64, method=method), sort)


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
def test_align_pairs_numbered_equals_unnumbered_and_sort(ma, num_pairs, block_m, num_used):
    """Decode batches of 9-511 sequences on a slot view of 3,338 rows with the layer's 128
    experts as `max_ids`: the ids numbered first give the unnumbered kernel's and the sort's
    outputs bit for bit (the tiles past num_rows too, as far as the shorter outputs go),
    from fewer rows (max_rows sized from the bound)."""
    ids = _view_ids(num_pairs, num_used, seed=num_pairs + block_m)
    numbered = ma.align_pairs(ids, VIEW_ROWS, block_m, method="kernel", max_ids=VIEW_EXPERTS)
    kernel = ma.align_pairs(ids, VIEW_ROWS, block_m, method="kernel")
    sort = ma.align_pairs(ids, VIEW_ROWS, block_m, method="sort")
    bound = min(num_pairs, VIEW_EXPERTS)
    assert numbered[0].numel() == triton.cdiv(num_pairs + bound * (block_m - 1), block_m) * block_m
    assert numbered[0].numel() <= kernel[0].numel()
    assert ma._numbered_bound(VIEW_ROWS, num_pairs, VIEW_EXPERTS) == bound  # it did number
    _assert_same(kernel, sort)
    # the counting sort with the same bound: the numbered kernel's outputs, same length
    _assert_same(ma.align_pairs(ids, VIEW_ROWS, block_m, method="count", max_ids=128), numbered)
    sorted_pairs, block_ids, num_rows = numbered
    assert torch.equal(num_rows, kernel[2])
    assert torch.equal(sorted_pairs, kernel[0][: sorted_pairs.numel()])
    assert torch.equal(block_ids, kernel[1][: block_ids.numel()])
    assert (sorted_pairs[num_rows.item() :] == num_pairs).all()  # padding past the rows used


class _GuardedTorch:
    """`torch` for `moe_align` whose `empty` buffers have sentinel guards either side."""

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
@pytest.mark.parametrize("method", ["kernel", "count"])
@pytest.mark.parametrize("block_m", [16, 64])
def test_align_pairs_with_more_ids_than_promised_stays_in_its_buffers(
    ma, monkeypatch, block_m, method
):
    """A broken promise (300 distinct ids, `max_ids` 128): the pairs of the ids numbered from
    128 on (the largest) are left out, the rest aligned as if those were -1, and no store
    lands outside the outputs and the scratch (sentinel guards around every buffer)."""
    num_pairs = 1500
    ids = _view_ids(num_pairs, 300, seed=block_m)
    assert torch.unique(ids[ids >= 0]).numel() > VIEW_EXPERTS
    guarded = _GuardedTorch()
    monkeypatch.setattr(ma, "torch", guarded)
    sorted_pairs, block_ids, num_rows = ma.align_pairs(
        ids, VIEW_ROWS, block_m, method=method, max_ids=VIEW_EXPERTS
    )
    monkeypatch.undo()
    assert len(guarded.buffers) == 4 and guarded.guards_intact()  # 3 outputs, 1 scratch
    kept = torch.unique(ids[ids >= 0])[:VIEW_EXPERTS]  # the 128 smallest used ids
    dropped = torch.where(torch.isin(ids, kept), ids, -1)
    want = ma.align_pairs(dropped, VIEW_ROWS, block_m, method="sort")
    assert num_rows.item() <= sorted_pairs.numel() and torch.equal(num_rows, want[2])
    assert torch.equal(sorted_pairs, want[0][: sorted_pairs.numel()])
    assert torch.equal(block_ids, want[1][: block_ids.numel()])


@pytest.mark.parametrize(
    "num_pairs,num_ids,max_ids,method",
    [
        (1638, 128, None, "kernel"), (1639, 128, None, "count"),  # 205 tokens at top-8
        (63, 3338, None, "kernel"), (64, 3338, None, "count"),  # an unnumbered view
        (1638, 3338, 128, "kernel"), (1639, 3338, 128, "count"),  # numbered to 128
        (4088, 3338, 128, "count"), (512, 3338, 128, "kernel"),  # decode 511 / 64 at top-8
        *[(4096, n, None, "count") for n in (1, 2, 8, 128, 3338)],  # what "sort" took
    ],
)  # fmt: skip
def test_align_pairs_default_method_follows_the_kernel_work(num_pairs, num_ids, max_ids, method):
    """Outside the interpreter: the default from host-known sizes (the kernel's element
    work against COUNT_ALIGN_WORK), and a bad method named before anything launches."""
    from xinfer.kernels import moe_align

    assert moe_align.default_align_method(num_pairs, num_ids, max_ids) == method
    with pytest.raises(ValueError, match="method"):
        moe_align.align_pairs(torch.zeros(3, dtype=torch.int32), 8, 16, method="radix")


@child_only
def test_align_pairs_default_runs_count_for_many_pairs(ma, monkeypatch) -> None:
    called = []
    real = ma._align_by_count
    monkeypatch.setattr(ma, "_align_by_count", lambda *a: called.append(a) or real(*a))
    ids = _ids(4096, 128, seed=4)
    default = ma.align_pairs(ids, 128, 64)
    assert called
    _assert_same(default, ma.align_pairs(ids, 128, 64, method="sort"))
