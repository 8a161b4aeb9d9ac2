"""Plain-Python models of prefetch reservations beside the slot LRU and beside the `lfu`
policy (the contract in xinfer.offload.prefetch_table, written independently of the tensor
code), and adversarial prediction streams for the prefetch tests: predictions that are
right, wrong, partly -1, full of duplicates, or wider than the slots."""

from __future__ import annotations

import random

import torch
from lru_model import PyLFU, PyLRU


class _Reservations:
    """What both models share: the counters, the pending prefetches and their settling, and
    the start of a reservation (the clock, the distinct valid predictions in order)."""

    def _init_reservations(self, num_experts: int) -> None:
        self.num_experts = num_experts
        self.pending: dict[int, int] = {}  # slot → expert prefetched into it
        self.reserve_clock = 0
        self.counts = dict.fromkeys(
            ("predicted", "present", "prefetched", "dropped", "used", "wasted"), 0
        )

    def _begin(self, flat_pred: list[int]) -> list[int]:
        """Settle the last reservation; advance the clock; the predicted experts in order."""
        for s, e in self.pending.items():
            hit = self.holder[s] == e and self.stamp[s] > self.reserve_clock
            self.counts["used" if hit else "wasted"] += 1
        self.pending = {}
        self.clock += 1
        self.reserve_clock = self.clock
        return list(dict.fromkeys(e for e in flat_pred if 0 <= e < self.num_experts))

    def _end(self, order: list[int], present: list[int], copies: list) -> list:
        self.counts["predicted"] += len(order)
        self.counts["present"] += len(present)
        self.counts["prefetched"] += len(copies)
        return copies


class PyPrefetchLRU(_Reservations, PyLRU):
    """PyLRU plus `reserve(pred)`: settle the last reservation, stamp predicted experts in
    slots, give absent ones the (stamp, slot)-smallest slots holding no predicted expert."""

    def __init__(self, num_experts: int, num_slots: int) -> None:
        super().__init__(num_experts, num_slots)
        self._init_reservations(num_experts)

    def reserve(self, flat_pred: list[int]) -> list[tuple[int, int]]:
        """Returns [(expert, slot)] to copy, in order."""
        order = self._begin(flat_pred)
        present = [e for e in order if e in self.slot_of]
        keep = {self.slot_of[e] for e in present}
        for s in keep:
            self.stamp[s] = self.clock
        copies = []
        for e in order:
            if e in self.slot_of:
                continue
            free = [s for s in range(self.num_slots) if s not in keep]
            if not free:
                self.counts["dropped"] += 1
                continue
            s = min(free, key=lambda s: (self.stamp[s], s))
            if self.holder[s] is not None:
                del self.slot_of[self.holder[s]]
            self.holder[s], self.slot_of[e], self.stamp[s] = e, s, self.clock
            keep.add(s)
            self.pending[s] = e
            copies.append((e, s))
        return self._end(order, present, copies)


class PyPrefetchLFU(_Reservations, PyLFU):
    """PyLFU plus `reserve(pred)`: settle as PyPrefetchLRU; counts do not change; an absent
    predicted expert is offered the free slot the next call would rank first (empty first,
    then the holder's count as that call decays it, stamp, slot) and takes it unless the
    holder, decayed, counts more than the expert decayed plus one call's 1024; refused, it
    is dropped and the slot offered to no later expert of the reservation."""

    def __init__(self, num_experts: int, num_slots: int) -> None:
        super().__init__(num_experts, num_slots)
        self._init_reservations(num_experts)
        self.refused_reservations = 0  # dropped by the admission test

    def reserve(self, flat_pred: list[int]) -> list[tuple[int, int]]:
        order = self._begin(flat_pred)
        present = [e for e in order if e in self.slot_of]
        taken = {self.slot_of[e] for e in present}
        for s in taken:
            self.stamp[s] = self.clock

        def decayed(c: int) -> int:
            return c - c // 8

        def rank(s: int) -> tuple[int, int, int]:
            held = self.holder[s]
            return (-1, -1, s) if held is None else (decayed(self.count[held]), self.stamp[s], s)

        copies = []
        for e in order:
            if e in self.slot_of:
                continue
            free = [s for s in range(self.num_slots) if s not in taken]
            if not free:
                self.counts["dropped"] += 1
                continue
            s = min(free, key=rank)
            taken.add(s)
            held = self.holder[s]
            if held is not None and decayed(self.count[held]) > decayed(self.count[e]) + 1024:
                self.counts["dropped"] += 1
                self.refused_reservations += 1
                continue
            if held is not None:
                del self.slot_of[held]
            self.holder[s], self.slot_of[e], self.stamp[s] = e, s, self.clock
            self.pending[s] = e
            copies.append((e, s))
        return self._end(order, present, copies)


def prediction_for(rng: random.Random, actual: torch.Tensor, num_experts: int) -> torch.Tensor:
    """A prediction (T', k) for a call routed to `actual` (T, k): exact, perturbed, random,
    partly -1, one row of one repeated id, or wider than the call."""
    ids = actual.clone()
    kind = rng.random()
    if kind < 0.2:
        return ids
    if kind < 0.5:  # some guesses wrong, some withheld
        flat = ids.reshape(-1)
        for j in range(flat.numel()):
            r = rng.random()
            if r < 0.3:
                flat[j] = rng.randrange(num_experts)
            elif r < 0.45:
                flat[j] = -1
        return ids
    if kind < 0.65:  # unrelated
        return torch.randint(0, num_experts, ids.shape, dtype=torch.int32)
    if kind < 0.75:  # one expert predicted many times
        return torch.full_like(ids, rng.randrange(num_experts))
    if kind < 0.85:  # nothing predicted
        return torch.full_like(ids, -1)
    rows = rng.randint(1, 3 * ids.shape[0] + 2)  # wider than the call (and the slots)
    return torch.randint(0, num_experts, (rows, ids.shape[1]), dtype=torch.int32)
