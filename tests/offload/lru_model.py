"""A plain-Python model of the slot LRU with call-local overflow rows (the spec in
xinfer.offload.lookup, written independently of the tensor code) and random routing streams
shared by the offload tests: narrow calls, calls with many duplicates, and calls that route
to more distinct experts than there are slots."""

from __future__ import annotations

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

# The property tests' random cache shapes: `@random_streams` gives a test (num_experts,
# num_slots, top_k, seed) with 1 <= top_k <= num_slots <= num_experts.
_SHAPE = st.integers(2, 40).flatmap(
    lambda e: st.tuples(st.just(e), st.integers(1, min(8, e))).flatmap(
        lambda ek: st.tuples(st.just(ek[0]), st.integers(ek[1], e), st.just(ek[1]))
    )
)


def random_streams(test):
    """60 examples of (num_experts, num_slots, top_k, seed) for a stream test."""

    @settings(max_examples=60, deadline=None)
    @given(shape=_SHAPE, seed=st.integers(0, 2**31 - 1))
    def run(shape, seed):
        test(*shape, seed)

    run.__name__, run.__doc__ = test.__name__, test.__doc__
    return run


class PyLRU:
    """Experts ↔ slots with a per-slot stamp; victims are the (stamp, slot)-smallest slots
    not used by the current call; once every slot is used by the call, further misses take
    the rows `overflow_base, overflow_base + 1, ...` and stay out of the tables."""

    def __init__(self, num_experts: int, num_slots: int, overflow_base: int | None = None) -> None:
        self.num_slots = num_slots
        self.overflow_base = num_slots if overflow_base is None else overflow_base
        self.overflow = self.max_call_misses = 0
        self.slot_of: dict[int, int] = {}
        self.holder: list[int | None] = [None] * num_slots
        self.stamp = [-1] * num_slots
        self.clock = 0
        self.hits = self.misses = 0

    def call(self, flat_ids: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
        """Returns (slot id per routed id, [(expert, slot) per miss, in order])."""
        self.clock += 1
        order: list[int] = []
        for e in flat_ids:
            if e not in order:
                order.append(e)
        busy = {self.slot_of[e] for e in order if e in self.slot_of}
        num_over = 0
        for s in busy:
            self.stamp[s] = self.clock
        self.hits += len(busy)
        fills, rows = [], {e: self.slot_of[e] for e in order if e in self.slot_of}
        for e in order:
            if e in rows:
                continue
            if len(busy) == self.num_slots:  # every slot serves this call: an overflow row
                rows[e] = self.overflow_base + num_over
                num_over += 1
                fills.append((e, rows[e]))
                continue
            s = min(
                (s for s in range(self.num_slots) if s not in busy),
                key=lambda s: (self.stamp[s], s),
            )
            if self.holder[s] is not None:
                del self.slot_of[self.holder[s]]
            self.holder[s], self.slot_of[e], self.stamp[s] = e, s, self.clock
            busy.add(s)
            rows[e] = s
            fills.append((e, s))
        self.misses += len(fills)
        self.overflow += num_over
        self.max_call_misses = max(self.max_call_misses, len(fills))
        return [rows[e] for e in flat_ids], fills


class PyLFU:
    """The `lfu` policy written out plainly: integer use counts decayed by 7/8 a call (+1024
    for each expert of the call); a miss is offered the free slot of smallest (empty first,
    count, stamp, slot) and refuses to evict an expert that counts more than it while the
    call's overflow rows have room (its slot is then offered to no later miss); misses
    without a slot or not admitted take overflow rows in order. Returns as `PyLRU.call`."""

    def __init__(self, num_experts: int, num_slots: int, num_overflow: int | None = None) -> None:
        self.num_slots = num_slots
        self.num_overflow = num_experts - num_slots if num_overflow is None else num_overflow
        self.count = [0] * num_experts
        self.slot_of: dict[int, int] = {}
        self.holder: list[int | None] = [None] * num_slots
        self.stamp = [-1] * num_slots
        self.clock = 0
        self.hits = self.misses = self.overflow = self.refused = 0

    def call(self, flat_ids: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
        self.clock += 1
        order = list(dict.fromkeys(flat_ids))
        self.count = [c - c // 8 for c in self.count]
        for e in order:
            self.count[e] += 1024
        hits = [e for e in order if e in self.slot_of]
        misses = [e for e in order if e not in self.slot_of]
        busy = {self.slot_of[e] for e in hits}
        for e in hits:
            self.stamp[self.slot_of[e]] = self.clock
        self.hits += len(hits)
        rows = {e: self.slot_of[e] for e in hits}
        offered = self.num_slots - len(hits)
        beyond = max(0, len(misses) - offered)
        over, fills = 0, []
        for i, e in enumerate(misses):
            if i >= offered:
                rows[e] = self.num_slots + over
                over += 1
                fills.append((e, rows[e]))
                continue

            def rank(s: int) -> tuple[int, int, int]:
                held = self.holder[s]
                return (-1, -1, s) if held is None else (self.count[held], self.stamp[s], s)

            s = min((s for s in range(self.num_slots) if s not in busy), key=rank)
            busy.add(s)
            held = self.holder[s]
            if (
                held is not None
                and self.count[held] > self.count[e]
                and (over + beyond < self.num_overflow)
            ):
                rows[e] = self.num_slots + over
                over += 1
                self.refused += 1
                fills.append((e, rows[e]))
                continue
            if held is not None:
                del self.slot_of[held]
            self.holder[s], self.slot_of[e], self.stamp[s] = e, s, self.clock
            rows[e] = s
            fills.append((e, s))
        self.misses += len(fills)
        self.overflow += over
        return [rows[e] for e in flat_ids], fills


def routing_stream(
    rng: random.Random,
    num_experts: int,
    num_slots: int,
    top_k: int,
    num_calls: int,
    max_rows: int | None = None,
) -> list[torch.Tensor]:
    """Decode-like batches (T*k <= S), batches drawn from a hot pool of <= S experts (many
    duplicate ids), and wide batches of up to `max_rows` rows (default 2 S / k + 2) whose
    distinct ids may exceed the slots; rows repeat an id now and then (k > 1)."""
    max_rows = max_rows or 2 * num_slots // top_k + 2
    calls = []
    for _ in range(num_calls):
        kind = rng.random()
        if kind < 0.45:
            rows = rng.randint(1, max(1, num_slots // top_k))
            pool = list(range(num_experts))
        elif kind < 0.7:
            rows = rng.randint(1, 6)
            pool = rng.sample(range(num_experts), rng.randint(top_k, num_slots))
        else:
            rows = rng.randint(1, max_rows)
            pool = list(range(num_experts))
        ids = [rng.sample(pool, top_k) for _ in range(rows)]
        if top_k > 1 and rng.random() < 0.2:  # a row that routes to one expert twice
            ids[0][1] = ids[0][0]
        calls.append(torch.tensor(ids, dtype=torch.int32))
    return calls


def random_expert_set(num_experts: int, seed: int, wide: bool = False) -> dict[str, torch.Tensor]:
    """A set of [E, ...] tensors of mixed dtypes and odd sizes (weights, scales, zero points):
    five (one fill launch), or with `wide` nine, so that the fill needs two launches (eight
    tensors a launch)."""
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "w13": torch.randn(num_experts, 6, 5, generator=g),
        "w2": torch.randn(num_experts, 5, 3, generator=g).to(torch.bfloat16),
        "scale": torch.randint(0, 255, (num_experts, 7), generator=g, dtype=torch.uint8),
        "w13_scale": torch.randn(num_experts, 3, generator=g).to(torch.float16),
        "w2_scale": torch.randint(0, 9, (num_experts, 2, 9), generator=g, dtype=torch.int32),
    }
    if wide:
        tensors |= {
            "w13_zeros": torch.randint(0, 15, (num_experts, 4, 3), generator=g, dtype=torch.uint8),
            "w2_zeros": torch.randint(0, 15, (num_experts, 11), generator=g, dtype=torch.uint8),
            "w13_scale_2": torch.randn(num_experts, 1, generator=g),
            "w2_scale_2": torch.randn(num_experts, 2, generator=g),
        }
    return tensors
