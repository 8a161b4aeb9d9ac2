"""The prompt pass's staging of packed experts (offload/packed_staging.py): planes copied a
chunk at a time into a device buffer sized for the widest packed tensor, then unpacked from
it into arbitrary rows — bit for bit the experts, whatever the chunking, the runs of the
expert ids, and tensors of different escape capacities through one buffer. And the packing's
side of pinning (the planes the host store pins when they are allocated): the packing writes
into the tensors the store hands back, and a declined packing unpins them."""

from __future__ import annotations

import random

import pytest
import torch

from xinfer.offload.packed import PackedExperts, pack_experts
from xinfer.offload.packed_staging import PackedStager

CPU = torch.device("cpu")


def _packed(num_experts: int, row: tuple[int, ...], seed: int, specials: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(num_experts, *row, generator=g) * 0.02).to(torch.bfloat16)
    flat = t.view(num_experts, -1)
    for _ in range(specials):  # tiny and huge values: escapes, more in some experts
        e = int(torch.randint(0, num_experts, (1,), generator=g))
        i = int(torch.randint(0, flat.shape[1], (1,), generator=g))
        flat[e, i] = float(torch.tensor([1e-30, 3e4, 0.0])[i % 3])
    p = pack_experts(t)
    assert isinstance(p, PackedExperts)
    return t, p


@pytest.mark.parametrize("chunk", [1, 3, 16])
@pytest.mark.parametrize("seed", [0, 1])
def test_staged_rows_are_the_experts(chunk, seed):
    small_t, small = _packed(11, (24, 64), seed, specials=5)
    wide_t, wide = _packed(11, (48, 64), seed + 7, specials=60)  # more escapes, wider rows
    assert wide.escapes.shape[1] > small.escapes.shape[1]
    stager = PackedStager([small, wide], CPU, chunk=chunk)
    assert stager.nbytes == chunk * sum(
        wide.planes[n][0].numel() * wide.planes[n].element_size() for n in wide.planes
    )
    rng = random.Random(seed)
    for t, p in ((small_t, small), (wide_t, wide), (small_t, small)):  # the buffer reused
        experts = rng.sample(range(11), 8)
        experts[2:5] = sorted(experts[2:5])  # some runs of consecutive ids, some not
        rows = rng.sample(range(20), len(experts))
        dst = torch.full((20, *t.shape[1:]), float("nan"), dtype=torch.bfloat16)
        stager.stage(p, dst, list(zip(experts, rows)))
        for e, r in zip(experts, rows):
            assert torch.equal(dst[r].view(torch.int16), t[e].view(torch.int16)), (e, r)
        untouched = sorted(set(range(20)) - set(rows))
        assert torch.isnan(dst[untouched].float()).all()


def test_nothing_to_stage_touches_nothing():
    t, p = _packed(4, (8, 64), 0, specials=0)
    stager = PackedStager([p], CPU)
    dst = torch.zeros((4, 8, 64), dtype=torch.bfloat16)
    stager.stage(p, dst, [])
    assert not torch.any(dst)


class _FakePinner:
    """The host store's side of packing, recorded: 'pins' by handing back a copy (as the
    store does for a tensor sharing a page with a registered one)."""

    def __init__(self) -> None:
        self.pinned: list[torch.Tensor] = []
        self.unpinned: list[int] = []

    def pin_after_fill(self, t: torch.Tensor) -> torch.Tensor:
        copy = t.clone()
        self.pinned.append(copy)
        return copy

    def unpin(self, t: torch.Tensor) -> None:
        self.unpinned.append(t.data_ptr())


def test_packing_writes_into_the_planes_the_pinner_hands_back():
    t, reference = _packed(6, (16, 64), 3, specials=4)
    pinner = _FakePinner()
    p = pack_experts(t, pinner=pinner)
    assert len(pinner.pinned) == 3 and not pinner.unpinned
    assert {x.data_ptr() for x in pinner.pinned} == {
        p.low.data_ptr(),
        p.codes.data_ptr(),
        p.starts.data_ptr(),
    }
    for e in range(6):
        assert torch.equal(p.unpack_row(e).view(torch.int16), t[e].view(torch.int16))
    for name in ("low", "codes", "starts", "escapes"):
        assert torch.equal(p.planes[name], reference.planes[name]), name


def test_a_declined_packing_unpins_its_planes():
    t = torch.full((2, 64), 1.0, dtype=torch.bfloat16)
    t[:, ::2] = 1e-30  # half the exponents far outside any window: escapes everywhere
    pinner = _FakePinner()
    assert pack_experts(t, pinner=pinner) is None
    assert sorted(pinner.unpinned) == sorted(x.data_ptr() for x in pinner.pinned)
    assert len(pinner.unpinned) == 3
