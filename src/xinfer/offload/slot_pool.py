"""The device rows behind every offloaded layer's slots: per expert tensor name ONE tensor
`[L·S + R·W, ...]` for a group of L layers with the same expert-set signature and S slots.

    rows [l·S, (l+1)·S)          layer l's LRU slots
    rows [L·S + r·W, L·S+(r+1)·W) region r (R = 1 or 2 regions of W = E - S rows), shared by
                                 all layers and used in stream order

Layer l's view is the pool from row l·S to the end, so every row it may need is an ordinary
id into that view: slot s is id s, row j of region r is id (L - l)·S + r·W + j. Region 0 is
the call-local overflow of `lookup` (a call that routes to more distinct experts than the
slots gets its extra misses there); the R regions are the buffers a prompt pass streams
layers into (offload/staging.py): with two, layer i+1's copy overlaps layer i's compute;
with one (`--moe-offload-stream-buffers 1`, or `auto` under a tight budget: W rows fewer for
more slots, offload/sizing.py) each layer's copy waits for the previous layer's reads. The
MoE kernel reads hits in place and everything else from those rows: no device-to-device
copies, no kernel change, any `[E, ...]` tensor set (the kernels compute `id * stride` in
64 bits)."""

from __future__ import annotations

import torch

from xinfer.offload.slot_cache import SlotCache

MAX_STREAM_BUFFERS = 2  # region 0: overflow / prompt-pass buffer A; region 1: buffer B


def set_signature(tensors: dict[str, torch.Tensor]) -> tuple:
    """What layers sharing a pool have in common: their tensors' names, row shapes, dtypes."""
    return tuple((n, tuple(t.shape), t.dtype) for n, t in tensors.items())


class SlotPool:
    """The rows of one group of layers (same tensor names, row shapes, dtypes, E and S) and
    `num_regions` shared regions (the prompt pass's stream buffers, 1 or 2)."""

    def __init__(
        self,
        host_tensors: dict[str, torch.Tensor],
        num_layers: int,
        num_slots: int,
        device: torch.device,
        num_regions: int = MAX_STREAM_BUFFERS,
    ) -> None:
        if not 1 <= num_regions <= MAX_STREAM_BUFFERS:
            raise ValueError(f"num_regions must be 1 or {MAX_STREAM_BUFFERS}, got {num_regions}")
        self.num_layers, self.num_slots, self.num_regions = num_layers, num_slots, num_regions
        self.num_experts = next(iter(host_tensors.values())).shape[0]
        self.region_rows = self.num_experts - num_slots  # W: a layer's non-resident experts
        rows = num_layers * num_slots + num_regions * self.region_rows
        self.tensors = {
            name: torch.empty((rows, *t.shape[1:]), dtype=t.dtype, device=device)
            for name, t in host_tensors.items()
        }

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def region_nbytes(self) -> int:
        """Bytes of the shared regions (what replaced the whole-layer staging buffer)."""
        row = sum(t[0].numel() * t.element_size() for t in self.tensors.values())
        return self.num_regions * self.region_rows * row

    def layer_view(self, index: int) -> dict[str, torch.Tensor]:
        """Layer `index`'s tensors: rows from its first slot to the end of the pool."""
        start = index * self.num_slots
        return {name: t[start:] for name, t in self.tensors.items()}

    def region_base(self, index: int, region: int) -> int:
        """Id (in layer `index`'s view) of the first row of `region`."""
        return (self.num_layers - index) * self.num_slots + region * self.region_rows


def build_slot_caches(
    host_layers: list[dict[str, torch.Tensor]],
    num_slots: list[int],
    device: torch.device,
    counters: torch.Tensor,
    max_call_ids: int,
    policy: str = "lru",
    stream_buffers: int = MAX_STREAM_BUFFERS,
) -> tuple[list[SlotCache], list[SlotPool]]:
    """One SlotCache per layer over pools shared by layers of one signature. `counters` is
    the (L, NUM_COUNTERS) stats tensor; `max_call_ids` bounds the routed ids of one lookup
    call (tokens × top-k), which bounds the overflow a call can need; `policy`: which expert
    a miss evicts (offload/lookup.py); `stream_buffers`: the regions of every pool (1 or 2,
    offload/sizing.py `plan_slots`), so each cache has that many `stream_bases`."""
    groups: dict[tuple, list[int]] = {}
    for i, (host, slots) in enumerate(zip(host_layers, num_slots)):
        groups.setdefault((set_signature(host), slots), []).append(i)
    caches: list[SlotCache | None] = [None] * len(host_layers)
    pools = []
    for (_, slots), members in groups.items():
        pool = SlotPool(host_layers[members[0]], len(members), slots, device, stream_buffers)
        pools.append(pool)
        overflow = min(pool.num_experts, max_call_ids) - slots
        for index, i in enumerate(members):
            has_regions = pool.region_rows > 0
            caches[i] = SlotCache(
                host_layers[i],
                slots,
                device,
                counters[i],
                slots=pool.layer_view(index),
                overflow_base=pool.region_base(index, 0),
                num_overflow=max(0, overflow),
                stream_bases=tuple(pool.region_base(index, r) for r in range(pool.num_regions))
                if has_regions
                else (),
                policy=policy,
            )
    return caches, pools
