"""Stable small integers for live requests, so that per-request device state (the routing
model's drift, any future recurrent state) can live in tensors indexed by a row carried in
the forward context — also inside CUDA graphs, as a static input. Each request also gets a
key: the order in which the runner first saw it (deterministic for a given workload).
Rows are recycled least-recently-scheduled first; the capacity is a few times the batch, so
only a request left unscheduled that long (a long preemption) loses its row and key."""

from __future__ import annotations

from collections import OrderedDict

_KEY_LIMIT = 1 << 31  # keys stay non-negative int32-sized; -1 marks padding


def request_row_capacity(max_num_seqs: int) -> int:
    """How many requests hold a row at once (the state tensors have one more: scratch)."""
    return 4 * max_num_seqs


class RequestSlots:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("RequestSlots needs a capacity of at least 1")
        self.capacity = capacity
        self.reset()

    def reset(self) -> None:
        """Forget every request (after the engine's warm-up: keys restart at 0)."""
        self._held: OrderedDict[str, tuple[int, int]] = OrderedDict()  # id → (row, key)
        self._free = list(range(self.capacity - 1, -1, -1))  # pop() gives row 0 first
        self._next_key = 0

    @property
    def scratch_row(self) -> int:
        """The row of a CUDA graph's padding sequences (never a request's)."""
        return self.capacity

    def assign(self, request_id: str) -> tuple[int, int]:
        """(row, key) of a request scheduled in this step; marks it most recently used."""
        held = self._held.get(request_id)
        if held is not None:
            self._held.move_to_end(request_id)
            return held
        if not self._free:  # recycle the least recently scheduled request's row
            _, (row, _) = self._held.popitem(last=False)
            self._free.append(row)
        held = (self._free.pop(), self._next_key)
        self._next_key = (self._next_key + 1) % _KEY_LIMIT
        self._held[request_id] = held
        return held
