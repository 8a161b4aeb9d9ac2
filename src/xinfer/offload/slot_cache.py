"""Per-layer expert slot cache on the device: the slot tensors `[S, ...]` that the MoE kernel
reads, the LRU tables that map experts to slots, and the miss list that `lookup` writes and
`fill` reads. Everything lives in device memory so that decode needs no host sync."""

from __future__ import annotations

import torch

# Columns of the per-layer counter row (int64, on the device; see offload/stats.py).
HITS, MISSES, STAGING_COPIES, CALLS = range(4)
NUM_COUNTERS = 4


class SlotCache:
    """Slots of one MoE layer.

    Invariants: `slot_of_expert[e] == s >= 0` iff `expert_of_slot[s] == e`; an empty slot has
    `expert_of_slot == -1` and `last_use == -1`, so it is the first choice for a miss."""

    def __init__(
        self,
        host_tensors: dict[str, torch.Tensor],
        num_slots: int,
        device: torch.device,
        counters: torch.Tensor,
    ) -> None:
        first = next(iter(host_tensors.values()))
        self.num_experts = first.shape[0]
        if not 1 <= num_slots <= self.num_experts:
            raise ValueError(f"num_slots must be in [1, {self.num_experts}], got {num_slots}")
        for name, t in host_tensors.items():
            if t.shape[0] != self.num_experts:
                raise ValueError(f"expert tensor {name!r} has {t.shape[0]} rows, not E")
        self.num_slots, self.device = num_slots, device
        i32 = dict(dtype=torch.int32, device=device)
        self.slot_of_expert = torch.full((self.num_experts,), -1, **i32)  # (E,) -1 = absent
        self.expert_of_slot = torch.full((num_slots,), -1, **i32)  # (S,) -1 = empty
        self.last_use = torch.full((num_slots,), -1, dtype=torch.int64, device=device)  # (S,)
        self.clock = torch.zeros(1, dtype=torch.int64, device=device)  # +1 per lookup
        self.miss_ids = torch.full((num_slots,), -1, **i32)  # (S,) expert of the m-th miss
        self.miss_slots = torch.full((num_slots,), -1, **i32)  # (S,) its slot
        self.miss_count = torch.zeros(1, **i32)
        self.counters = counters  # (NUM_COUNTERS,) int64 row of OffloadStats.counters
        # name → (S, ...) in the host tensors' dtype: what the MoE kernel reads.
        self.slots = {
            name: torch.empty((num_slots, *t.shape[1:]), dtype=t.dtype, device=device)
            for name, t in host_tensors.items()
        }
        self.expert_bytes = sum(t[0].numel() * t.element_size() for t in host_tensors.values())

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
