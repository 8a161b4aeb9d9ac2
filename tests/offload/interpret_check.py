"""Run by test_offload_triton_interpret.py with TRITON_INTERPRET=1: drives the Triton lookup
and fill (interpreted, on CPU tensors) and their reference twins with the same random
routing streams and asserts identical tables, slot ids, miss lists, counters and bytes."""

from __future__ import annotations

import os
import random

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402
from lru_model import random_expert_set, routing_stream  # noqa: E402

from xinfer.offload import kernels as offload_kernels  # noqa: E402
from xinfer.offload.lookup import fill_reference, lookup_reference  # noqa: E402
from xinfer.offload.slot_cache import SlotCache  # noqa: E402

CASES = [(8, 2, 2, 30), (8, 8, 2, 20), (20, 7, 3, 30), (70, 24, 8, 12)]  # E, S, k, calls


def _cache(host: dict[str, torch.Tensor], num_slots: int) -> SlotCache:
    return SlotCache(host, num_slots, torch.device("cpu"), torch.zeros(4, dtype=torch.int64))


def check(num_experts: int, num_slots: int, top_k: int, num_calls: int) -> None:
    host = random_expert_set(num_experts, seed=num_experts + num_slots)
    ref, tri = _cache(host, num_slots), _cache(host, num_slots)
    stream = routing_stream(random.Random(num_slots), num_experts, num_slots, top_k, num_calls)
    for step, ids in enumerate(stream):
        want = lookup_reference(ref, ids)
        fill_reference(ref, host)
        # One warp on odd calls: smaller id blocks, so wide calls take several blocks.
        got = offload_kernels.lookup(tri, ids, force_triton=True, num_warps=1 + 3 * (step % 2))
        # Tiny blocks over a few programs: rows that are not multiples of the block, blocks
        # of one row dealt to several programs, more than four tensors (two launches).
        offload_kernels.fill(tri, host, force_triton=True, num_programs=3, block=4)
        where = f"E={num_experts} S={num_slots} k={top_k} call {step}"
        assert torch.equal(got, want), (where, got, want)
        for name, value in ref.state().items():
            assert torch.equal(tri.state()[name], value), (where, name)
        n = int(ref.miss_count)
        assert int(tri.miss_count) == n, where
        assert torch.equal(tri.miss_ids[:n], ref.miss_ids[:n]), where
        assert torch.equal(tri.miss_slots[:n], ref.miss_slots[:n]), where
        assert torch.equal(tri.counters, ref.counters), where
        for s, e in enumerate(tri.expert_of_slot.tolist()):
            for name, t in host.items():
                if e >= 0:
                    assert torch.equal(tri.slots[name][s], t[e]), (where, name, s)


if __name__ == "__main__":
    for case in CASES:
        check(*case)
    print("interpreted kernels match the reference twins")
