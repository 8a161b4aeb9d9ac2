"""Run by test_offload_triton_interpret.py with TRITON_INTERPRET=1: drives the Triton lookup
and fill (interpreted, on CPU tensors) and their reference twins with the same random
routing streams (narrow, duplicate-heavy and wider than the slots, so misses overflow) and
asserts identical tables, rows, miss lists, counters and bytes; then hands the kernel ids
outside [0, E), which it must clamp (the twin gets the clamped ids)."""

from __future__ import annotations

import os
import random

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402
from lru_model import PyLFU, random_expert_set, routing_stream  # noqa: E402

from xinfer.offload import kernels as offload_kernels  # noqa: E402
from xinfer.offload.lookup import fill_reference, lookup_reference  # noqa: E402
from xinfer.offload.slot_cache import NUM_COUNTERS, OVERFLOW, SlotCache  # noqa: E402
from xinfer.offload.slot_pool import build_slot_caches  # noqa: E402

CPU = torch.device("cpu")

# E, S, k, calls, widest call (rows)
CASES = [(8, 2, 2, 30, 6), (8, 8, 2, 20, 4), (20, 7, 3, 30, 9), (70, 24, 8, 12, 20)]


def _cache(host: dict[str, torch.Tensor], num_slots: int, **kw) -> SlotCache:
    return SlotCache(host, num_slots, torch.device("cpu"), **kw)


def with_bad_ids(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """A copy of `ids` whose first id is negative and last id is past E - 1."""
    flat = ids.clone().reshape(-1)
    flat[0], flat[-1] = -7, num_experts + 3
    return flat.view(ids.shape)


def check(num_experts: int, num_slots: int, top_k: int, num_calls: int, max_rows: int,
          wide: bool = False, **kw) -> None:  # fmt: skip
    host = random_expert_set(num_experts, seed=num_experts + num_slots, wide=wide)
    ref, tri = _cache(host, num_slots, **kw), _cache(host, num_slots, **kw)
    rng = random.Random(num_slots)
    stream = routing_stream(rng, num_experts, num_slots, top_k, num_calls, max_rows)
    if "num_overflow" in kw:  # only calls that fit the slots and the few overflow rows
        stream = [ids for ids in stream if ids.numel() <= num_slots + kw["num_overflow"]]
    lfu = PyLFU(num_experts, num_slots, kw.get("num_overflow"))  # counts refusals
    for step, ids in enumerate(stream):
        tri_ids = ids
        if step % 5 == 4:  # every fifth call: ids outside [0, E), clamped by the kernel
            tri_ids = with_bad_ids(ids, num_experts)
            ids = tri_ids.clamp(0, num_experts - 1)
        want = lookup_reference(ref, ids)
        fill_reference(ref, host)
        lfu.call(ids.reshape(-1).tolist())
        # One warp on odd calls: smaller id blocks, so wide calls take several blocks.
        got = offload_kernels.lookup(
            tri, tri_ids, force_triton=True, num_warps=1 + 3 * (step % 2), check_range=False
        )
        # Tiny blocks over a few programs: rows that are not multiples of the block, blocks
        # of one row dealt to several programs; with `wide`, nine tensors (two launches).
        offload_kernels.fill(tri, host, force_triton=True, num_programs=3, block=4)
        where = f"E={num_experts} S={num_slots} k={top_k} {kw} call {step}"
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
        for e, r in zip(ids.reshape(-1).tolist(), got.reshape(-1).tolist()):
            for name, t in host.items():  # every row the MoE kernel will read
                assert torch.equal(tri.slots[name][r], t[e]), (where, name, e, r)
    if num_slots < num_experts:
        assert int(tri.counters[OVERFLOW]) > 0, "the stream never overflowed the slots"
    if kw.get("policy") == "lfu" and num_slots < num_experts:
        assert lfu.refused > 0, "the stream never refused a miss"


def check_pool(num_layers: int = 3, num_experts: int = 12, num_slots: int = 3) -> None:
    """Layers over one pool (overflow rows past the later layers' slots): kernel == twin
    and no layer writes another layer's rows."""
    hosts = [random_expert_set(num_experts, seed=i) for i in range(num_layers)]
    made = []
    for _ in range(2):
        counters = torch.zeros(num_layers, NUM_COUNTERS, dtype=torch.int64)
        caches, pools = build_slot_caches(hosts, [num_slots] * num_layers, CPU, counters, 40)
        made.append(caches)
    rng = random.Random(5)
    for step in range(36):
        layer = step % num_layers
        ref, tri, host = made[0][layer], made[1][layer], hosts[layer]
        ids = routing_stream(rng, num_experts, num_slots, 2, 1, max_rows=10)[0]
        want = lookup_reference(ref, ids)
        fill_reference(ref, host)
        got = offload_kernels.lookup(tri, ids, force_triton=True)
        offload_kernels.fill(tri, host, force_triton=True, num_programs=3, block=8)
        assert torch.equal(got, want), (step, got, want)
        assert torch.equal(tri.counters, ref.counters), step
        for other in range(num_layers):  # every layer's cached experts are intact
            for s, e in enumerate(made[1][other].expert_of_slot.tolist()):
                if e >= 0:
                    got_row = made[1][other].slots["w13"][s]
                    assert torch.equal(got_row, hosts[other]["w13"][e]), (step, other, s)


def check_routing_ids_in_range() -> None:
    """The routing kernel, the source of device-side ids, only produces ids in [0, E), one
    expert once per row, even for NaN / inf logits (the lookup's device contract)."""
    from xinfer.kernels import moe_launch

    g = torch.Generator().manual_seed(0)
    for num_experts, top_k in ((8, 2), (60, 4), (128, 8)):
        logits = torch.randn(6, num_experts, generator=g)
        logits[1, 3] = float("nan")
        logits[2, :] = float("nan")
        logits[3, 5] = float("inf")
        logits[4, :] = float("-inf")
        _, ids = moe_launch.route_topk(logits, top_k, renormalize=True)
        assert int(ids.min()) >= 0 and int(ids.max()) < num_experts, (num_experts, ids)
        assert all(len(set(row)) == top_k for row in ids.tolist()), ids


if __name__ == "__main__":
    for case in CASES:
        check(*case)
        check(*case, policy="lfu")
    check(20, 7, 3, 10, 9, wide=True)  # nine tensors: a launch of eight, then one
    # LFU with few overflow rows: admission stops where the rows run out (calls of at most
    # S + 3 ids, so every call fits)
    check(20, 4, 2, 40, 3, policy="lfu", num_overflow=3)
    check_pool()
    check_routing_ids_in_range()
    print("interpreted kernels match the reference twins")
