"""The unpack kernel (`kernels/triton/offload_packed.py`) in Triton's CPU interpreter against
its twin (`PackedExperts.unpack_row`): one and two packed tensors a launch, rows of one
block, of several and of a partial last block, escapes inside and across blocks, misses into
slots and overflow rows in any order, a miss count below the list's length; and `fill` on a
layer that mixes packed and plain tensors (two launches), after real lookups.

TRITON_INTERPRET must be set before the kernels are decorated, so in a normal run one test
re-runs this file in a child pytest with TRITON_INTERPRET=1, and the cases run only there."""

from __future__ import annotations

import random

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted
from lru_model import routing_stream

from xinfer.offload import kernels as offload_kernels
from xinfer.offload.lookup import fill_reference, lookup_reference
from xinfer.offload.packed import PACK_BLOCK, pack_experts, unpack_fill
from xinfer.offload.slot_cache import SlotCache

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def interpreted():
    from xinfer.kernels.triton import offload_packed as jit

    require_interpreted(jit.unpack_fill_kernel)


def _weights(num_experts: int, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    t = (torch.randn(num_experts, *shape, generator=gen) * 0.02).to(torch.bfloat16)
    flat = t.view(num_experts, -1)
    n = flat.shape[1]
    for e in range(num_experts):  # escapes: zeros (one run across a block edge), inf, huge
        flat[e, (7 * e) % n] = 0.0
        flat[e, min(n - 1, PACK_BLOCK - 2) : min(n, PACK_BLOCK + 2)] = -0.0
        flat[e, (13 * e + 5) % n] = float("inf") if e % 2 else 3e38
    return t


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.reshape(-1).view(torch.int16), b.reshape(-1).view(torch.int16))


@child_only
@pytest.mark.parametrize(
    "shapes", [[(8, 24)], [(96, 128)], [(2 * 48, 64), (48, 3 * 32 + 8)]], ids=str
)
def test_unpack_kernel_equals_twin(interpreted, shapes):
    num_experts, rows = 6, 9
    packed = [pack_experts(_weights(num_experts, s, seed=i)) for i, s in enumerate(shapes)]
    assert all(p is not None for p in packed)
    dst = [torch.zeros(rows, *s, dtype=torch.bfloat16) for s in shapes]
    ids = torch.tensor([4, 0, 5, 2, 1, 3, 0], dtype=torch.int32)
    slots = torch.tensor([8, 1, 0, 6, 3, 2, 7], dtype=torch.int32)
    count = torch.tensor([6], dtype=torch.int32)  # the last pair is past the count
    unpack_fill(packed, dst, ids, slots, count, num_programs=3, mapped=False)
    for e, s in zip(ids[:6].tolist(), slots[:6].tolist()):
        for p, d in zip(packed, dst):
            assert _same_bits(d[s], p.unpack_row(e)), (e, s)
    for d in dst:
        assert not d[7].view(torch.int16).any() and not d[4].view(torch.int16).any()


@child_only
def test_fill_with_packed_and_plain_tensors_equals_twin(interpreted):
    """A layer of a packed w13, a packed w2 and a plain fp32 tensor: lookups with overflow,
    then `fill` (the unpack launch and the plain fill launch) against `fill_reference`."""
    num_experts, num_slots = 12, 3
    host = {
        "w13": pack_experts(_weights(num_experts, (2 * 32, 40), seed=1)),
        "w2": pack_experts(_weights(num_experts, (40, 32), seed=2)),
        "bias": torch.randn(num_experts, 40),
    }
    caches = [SlotCache(host, num_slots, CPU) for _ in range(2)]
    rng = random.Random(5)
    for step, ids in enumerate(routing_stream(rng, num_experts, num_slots, 2, 15, 5)):
        for cache in caches:
            lookup_reference(cache, ids)
        fill_reference(caches[0], host)
        offload_kernels.fill(caches[1], host, force_triton=True, num_programs=3, block=64)
        rows = int(caches[0].miss_count)
        for name in host:
            for r in caches[0].miss_slots[:rows].tolist():
                a, b = caches[0].slots[name][r], caches[1].slots[name][r]
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (step, name, r)
