"""Arrival counters: one int32 tensor per device for kernels whose programs finish a
reduction themselves instead of leaving it to a second launch. Each program of a group (the
pairs of a token's MoE tile, the K splits of a linear's output tile, the key splits of a
decode sequence's KV head) stores its part, then adds 1 to its group's counter
(acquire-release, GPU scope); the one that sees the group's last arrival reads the parts,
writes the result and sets the counter back to 0, so the counters are zero between launches
and a CUDA graph can replay them (`fused_moe.combine_when_last`, `gemv.reduce_when_last`,
`attention._merge_when_last`). Bits: the finishing program adds the parts in the second
kernel's order, so the output is the two-launch path's.

The tensor is made at a call outside any CUDA graph capture (made inside, it would come from
the graph's pool and die with it): a launcher that gets None combines in a second launch, with
the same bits. Launches that use one tensor must run one after another on the device (one
stream): a decode step's kernels do. Work on another stream beside them (the prefetch
predictor's router GEMV on the prefetch stream) takes counters of its own: its launches run
inside `lane(name)`, each lane of a device has its own tensor."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# groups one launch may count: 64 tokens x 1,024 MoE row tiles, or 65,536 linear tiles
CAPACITY = 1 << 16
MAIN = "main"
_by_lane: dict[tuple[torch.device, str], torch.Tensor] = {}
_lane = MAIN


@contextlib.contextmanager
def lane(name: str) -> Iterator[None]:
    """Launches inside use the counters of lane `name` (make them with `counters` outside
    a capture first, or those launches reduce in a second launch)."""
    global _lane
    before, _lane = _lane, name
    try:
        yield
    finally:
        _lane = before


def counters(device: torch.device, groups: int) -> torch.Tensor | None:
    """The current lane's zeroed counters on `device` when `groups` fit in them; None
    (launch apart) when they do not, or when they do not exist yet and a CUDA graph is being
    captured."""
    key = (device, _lane)
    found = _by_lane.get(key)
    if found is None and not _capturing(device):
        found = _by_lane[key] = torch.zeros(CAPACITY, dtype=torch.int32, device=device)
    return found if found is not None and groups <= found.numel() else None


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
