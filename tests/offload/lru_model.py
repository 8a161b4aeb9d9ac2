"""A plain-Python model of the slot LRU (the spec in xinfer.offload.lookup, written
independently of the tensor code) and random routing streams shared by the offload tests."""

from __future__ import annotations

import random

import torch


class PyLRU:
    """Experts ↔ slots with a per-slot stamp; victims are the (stamp, slot)-smallest slots
    not used by the current call."""

    def __init__(self, num_experts: int, num_slots: int) -> None:
        self.num_slots = num_slots
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
        for s in busy:
            self.stamp[s] = self.clock
        self.hits += len(busy)
        fills = []
        for e in order:
            if e in self.slot_of:
                continue
            s = min(
                (s for s in range(self.num_slots) if s not in busy),
                key=lambda s: (self.stamp[s], s),
            )
            if self.holder[s] is not None:
                del self.slot_of[self.holder[s]]
            self.holder[s], self.slot_of[e], self.stamp[s] = e, s, self.clock
            busy.add(s)
            fills.append((e, s))
        self.misses += len(fills)
        return [self.slot_of[e] for e in flat_ids], fills


def routing_stream(
    rng: random.Random, num_experts: int, num_slots: int, top_k: int, num_calls: int
) -> list[torch.Tensor]:
    """Calls whose distinct ids fit in the slots: decode-like batches (T*k <= S) and wider
    batches drawn from a hot pool of <= S experts (many duplicate ids)."""
    calls = []
    for _ in range(num_calls):
        if rng.random() < 0.6:
            rows = rng.randint(1, max(1, num_slots // top_k))
            pool = list(range(num_experts))
        else:
            rows = rng.randint(1, 6)
            pool = rng.sample(range(num_experts), rng.randint(top_k, num_slots))
        ids = [rng.sample(pool, top_k) for _ in range(rows)]
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
