"""A plain-Python model of the slot LRU with call-local overflow rows (the spec in
xinfer.offload.lookup, written independently of the tensor code) and random routing streams
shared by the offload tests: narrow calls, calls with many duplicates, and calls that route
to more distinct experts than there are slots."""

from __future__ import annotations

import random

import torch


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


def random_expert_set(num_experts: int, seed: int) -> dict[str, torch.Tensor]:
    """A set of [E, ...] tensors of mixed dtypes and odd sizes (weights and scales); five of
    them, so that the fill needs two launches (four tensors a launch)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "w13": torch.randn(num_experts, 6, 5, generator=g),
        "w2": torch.randn(num_experts, 5, 3, generator=g).to(torch.bfloat16),
        "scale": torch.randint(0, 255, (num_experts, 7), generator=g, dtype=torch.uint8),
        "w13_scale": torch.randn(num_experts, 3, generator=g).to(torch.float16),
        "w2_scale": torch.randint(0, 9, (num_experts, 2, 9), generator=g, dtype=torch.int32),
    }
