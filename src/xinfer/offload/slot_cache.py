"""Per-layer expert slot cache on the device: the tables that map experts to slots (and the
`lfu` policy's use counts), the miss list that `lookup` writes and `fill` reads, and the
layer's view of the slot rows the MoE kernel reads. Everything lives in device memory so
that decode needs no host sync.

The view (`slots`, one tensor per expert tensor name) starts at the layer's first slot; its
rows are ids the MoE kernel can address: `[0, S)` are this layer's slots and
`[overflow_base, overflow_base + num_overflow)` the call-local overflow rows that misses use
when every slot is taken by the same call, or, under `lfu`, when a miss is not admitted (see
offload/slot_pool.py for the shared layout)."""

from __future__ import annotations

import torch

from xinfer.config import OFFLOAD_POLICIES
from xinfer.offload.packed import unpacked_row_bytes

# Columns of the per-layer counter row (int64, on the device; see offload/stats.py).
HITS, MISSES, STAGING_COPIES, CALLS, OVERFLOW, MAX_CALL_MISSES, STREAMED = range(7)
NUM_COUNTERS = 7
# The `lfu` policy's decayed use count, in integers so that the kernel and its twin agree
# bit for bit: every call, score -= score >> LFU_SHIFT (x 7/8), then + LFU_STEP for each
# expert the call routes to (steady state of an expert routed every call: 8 x LFU_STEP).
LFU_SHIFT = 3
LFU_STEP = 1024


def lfu_decay(score: int) -> int:
    """One call's decay of an `lfu` use count (the kernels do the same in integers)."""
    return score - (score >> LFU_SHIFT)


class SlotCache:
    """Slots of one MoE layer.

    Invariants: `slot_of_expert[e] == s >= 0` iff `expert_of_slot[s] == e`; an empty slot has
    `expert_of_slot == -1` and `last_use == -1`, so it is the first choice for a miss. Experts
    in overflow rows are never in the tables: the rows are reused by the next call.

    `slots`, `overflow_base`: the layer's view and where its overflow rows start in it (from a
    `SlotPool`); without them the cache allocates its own `[S + num_overflow, ...]` rows.
    `num_overflow`: overflow rows a call may use (default E - S: any call fits)."""

    def __init__(
        self,
        host_tensors: dict[str, torch.Tensor],
        num_slots: int,
        device: torch.device,
        counters: torch.Tensor | None = None,
        *,
        slots: dict[str, torch.Tensor] | None = None,
        overflow_base: int | None = None,
        num_overflow: int | None = None,
        stream_bases: tuple[int, ...] = (),
        policy: str = "lru",
    ) -> None:
        first = next(iter(host_tensors.values()))
        self.num_experts = first.shape[0]
        if not 1 <= num_slots <= self.num_experts:
            raise ValueError(f"num_slots must be in [1, {self.num_experts}], got {num_slots}")
        for name, t in host_tensors.items():
            if t.shape[0] != self.num_experts:
                raise ValueError(f"expert tensor {name!r} has {t.shape[0]} rows, not E")
        self.num_slots, self.device = num_slots, device
        if policy not in OFFLOAD_POLICIES:
            raise ValueError(f"policy must be one of {OFFLOAD_POLICIES}, got {policy!r}")
        self.policy = policy
        self.num_overflow = self.num_experts - num_slots if num_overflow is None else num_overflow
        if not 0 <= self.num_overflow <= self.num_experts - num_slots:
            raise ValueError(f"num_overflow must be in [0, E - S], got {self.num_overflow}")
        # Distinct experts one call may route to: slots plus overflow rows.
        self.capacity = num_slots + self.num_overflow
        if counters is None:
            counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64, device=device)
        if counters.shape != (NUM_COUNTERS,):
            raise ValueError(f"counters must be one ({NUM_COUNTERS},) int64 row")
        self.counters = counters  # a row of OffloadStats.counters
        i32 = dict(dtype=torch.int32, device=device)
        self.slot_of_expert = torch.full((self.num_experts,), -1, **i32)  # (E,) -1 = absent
        self.expert_of_slot = torch.full((num_slots,), -1, **i32)  # (S,) -1 = empty
        self.last_use = torch.full((num_slots,), -1, dtype=torch.int64, device=device)  # (S,)
        self.clock = torch.zeros(1, dtype=torch.int64, device=device)  # +1 per lookup
        # `lfu`: every expert's decayed use count, and each slot's copy of its expert's (0
        # when empty); kept under `lru` too (unused) so that every cache has one layout
        self.score = torch.zeros((self.num_experts,), **i32)
        self.slot_score = torch.zeros((num_slots,), **i32)
        self.miss_ids = torch.full((self.capacity,), -1, **i32)  # expert of the m-th miss
        self.miss_slots = torch.full((self.capacity,), -1, **i32)  # its row in `slots`
        self.miss_count = torch.zeros(1, **i32)
        if slots is None:
            rows = num_slots + self.num_overflow
            slots = {
                name: torch.empty((rows, *t.shape[1:]), dtype=t.dtype, device=device)
                for name, t in host_tensors.items()
            }
            overflow_base = num_slots
        self.overflow_base = num_slots if overflow_base is None else overflow_base
        for name, view in slots.items():
            if view.shape[0] < self.overflow_base + self.num_overflow:
                raise ValueError(f"slot view {name!r} has too few rows for its overflow")
        self.slots = slots  # name → (rows, ...) in the host tensors' dtype: what the kernel reads
        self.stream_bases = stream_bases  # rows of the prompt pass's staging regions (slot_pool)
        self.expert_bytes = sum(unpacked_row_bytes(t) for t in host_tensors.values())

    @property
    def slot_bytes(self) -> int:
        return self.num_slots * self.expert_bytes

    def state(self) -> dict[str, torch.Tensor]:
        """Copies of the LRU tables (for tests and debugging)."""
        return {
            "slot_of_expert": self.slot_of_expert.clone(),
            "expert_of_slot": self.expert_of_slot.clone(),
            "last_use": self.last_use.clone(),
            "clock": self.clock.clone(),
            "score": self.score.clone(),
            "slot_score": self.slot_score.clone(),
        }

    def check_invariants(self) -> None:
        """Raise if the tables disagree (host-side check, for tests)."""
        soe, eos = self.slot_of_expert.tolist(), self.expert_of_slot.tolist()
        for e, s in enumerate(soe):
            if s >= 0 and eos[s] != e:
                raise AssertionError(f"expert {e} → slot {s}, but slot {s} holds {eos[s]}")
        for s, e in enumerate(eos):
            if e >= 0 and soe[e] != s:
                raise AssertionError(f"slot {s} holds {e}, but expert {e} → slot {soe[e]}")
        if self.policy == "lfu":
            score, slot_score = self.score.tolist(), self.slot_score.tolist()
            for s, e in enumerate(eos):
                if e >= 0 and slot_score[s] != score[e]:
                    raise AssertionError(f"slot {s} scores {slot_score[s]}, its expert {score[e]}")
