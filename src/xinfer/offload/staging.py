"""The prefill staging buffer: one device buffer, shared by all MoE layers, that receives a
whole layer's `[E, ...]` expert set (copy engine, async from pinned memory) when a call
touches more distinct experts than the layer has slots. Layers reuse it in stream order."""

from __future__ import annotations

import torch

_ALIGN = 256  # bytes; keeps every tensor view aligned for any dtype and vector loads


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def staging_bytes_for(tensors: dict[str, torch.Tensor]) -> int:
    """Bytes the staging buffer needs to hold this set of `[E, ...]` tensors."""
    return sum(_aligned(t.numel() * t.element_size()) for t in tensors.values())


class StagingBuffer:
    def __init__(self, device: torch.device, nbytes: int) -> None:
        self.device, self.nbytes = device, nbytes
        self.buffer: torch.Tensor | None = None  # (nbytes,) uint8, allocated once

    @property
    def is_allocated(self) -> bool:
        return self.buffer is not None

    def allocate(self) -> None:
        if self.buffer is None:
            self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)

    def load(self, host_tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copy a layer's expert set in (async on CUDA); returns views shaped like it."""
        self.allocate()
        if staging_bytes_for(host_tensors) > self.nbytes:
            raise ValueError("staging buffer is smaller than this layer's experts")
        views, offset = {}, 0
        for name, t in host_tensors.items():
            nbytes = t.numel() * t.element_size()
            view = self.buffer[offset : offset + nbytes].view(t.dtype).view(t.shape)
            view.copy_(t, non_blocking=True)
            views[name] = view
            offset += _aligned(nbytes)
        return views
