"""The prompt pass's staging of packed experts (`--moe-offload-compress`) through the copy
engine: a layer's missing experts cross the link as their packed planes, in bulk copies into
a small device buffer, and the unpack kernel then reads them from VRAM.

Why not unpack straight from host memory, as the decode fill does: there the SMs read the
link, and their read rate depends on the host — 49 GB/s on one H100 host, 28 on another
whose copy engine moved the plain staging's bulk copies at 53 (2026-12-05: an 8k prompt at
10% took 1.67 s packed against 0.97 s plain). Bulk copies run at the copy engine's rate on
both, and 3/4 of the bytes cross.

The buffer holds STAGING_CHUNK experts of every plane (sized for the largest packed tensor
of the model); a layer's tensor goes through it a chunk at a time, copy then unpack, in the
order of the one side stream that stages every layer (so reuse needs no event). On CPU the
same path runs with the reference unpack: CI checks the chunking and the row mapping."""

from __future__ import annotations

import torch

from xinfer.offload.kernels import fill_grid
from xinfer.offload.packed import PackedExperts, unpack_fill, unpack_rows_reference
from xinfer.offload.staging import copy_runs

STAGING_CHUNK = 16  # experts a round moves; the buffer: 16 rows of the widest packed tensor
# (Qwen3-30B-A3B: w13, 4.72 MB packed a row: 75.5 MB)
# The unpack reads VRAM here, beside the prefill's GEMMs: a small grid is enough.
STAGING_UNPACK_PROGRAMS_PER_SM = 2


def _row_bytes(t: torch.Tensor) -> int:
    return t[0].numel() * t.element_size()


class PackedStager:
    """The device buffer for `packed` (every packed tensor the streamer may stage) and the
    copy-then-unpack rounds through it."""

    def __init__(
        self, packed: list[PackedExperts], device: torch.device, chunk: int = STAGING_CHUNK
    ) -> None:
        self.device, self.chunk = device, chunk
        self.is_cuda = device.type == "cuda"
        names = ("low", "codes", "escapes", "starts")
        widest = {n: max((_row_bytes(p.planes[n]) for p in packed), default=0) for n in names}
        self.buffers = {
            n: torch.empty(chunk * widest[n], dtype=torch.uint8, device=device) for n in names
        }

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.buffers.values())

    def _views(self, host: PackedExperts, count: int) -> dict[str, torch.Tensor]:
        """The buffer as `count` rows of each of `host`'s planes."""
        views = {}
        for name, plane in host.planes.items():
            flat = self.buffers[name][: count * _row_bytes(plane)]
            views[name] = flat.view(plane.dtype).view(count, *plane.shape[1:])
        return views

    def stage(self, host: PackedExperts, dst: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        """Experts `e` of `host` unpacked into rows `r` of `dst`, for each (e, r) of `pairs`,
        on the current stream (the streamer's side stream on CUDA)."""
        for start in range(0, len(pairs), self.chunk):
            part = pairs[start : start + self.chunk]
            views = self._views(host, len(part))
            for e, i, n in copy_runs([(e, i) for i, (e, _) in enumerate(part)]):
                for name, plane in host.planes.items():
                    views[name][i : i + n].copy_(plane[e : e + n], non_blocking=True)
            staged = host.with_planes(views)
            local = [(i, r) for i, (_, r) in enumerate(part)]
            if not self.is_cuda:
                unpack_rows_reference(staged, dst, local)
                continue
            lists = torch.tensor([*zip(*local), (len(local),) * len(local)], dtype=torch.int32)
            # pinned: an async copy (torch's host allocator keeps the buffer until it ran)
            experts, rows, count = lists.pin_memory().to(self.device, non_blocking=True)
            programs = fill_grid(self.device, STAGING_UNPACK_PROGRAMS_PER_SM)
            unpack_fill([staged], [dst], experts, rows, count[:1], programs, mapped=False)
