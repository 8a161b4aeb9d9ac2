"""Host memory for large tensors that the GPU reads through the PCIe link (routed experts
under offload): an anonymous mapping of its own, aligned to 2 MiB and advised as transparent
huge pages (`MADV_HUGEPAGE`), so that the pinned, device-mapped pages the fill kernels read
are 2 MiB rather than 4 KiB. Measured on an H100 host whose IOMMU translates DMA (2026-12-05):
the SM fill read 27.0 GB/s from 4 KiB pages and 31.0 GB/s from huge pages (packed experts
27.9 → 33.2). Where the kernel offers no huge pages (THP `never`, not Linux) the mapping is
still page-aligned and owns its pages, which is all the host store needs to pin it in place;
`XINFER_HOST_HUGE_PAGES=0` asks for 4 KiB pages.

The pages are faulted in when the mapping is made, by a zero fill on torch's intra-op
threads: a first touch costs far more than a write (measured on the CPU machine: 0.4-2.5
GB/s on one thread, 1.6-3.8 on two, against 8-16 GB/s to rewrite touched pages), and some
first writers run on one thread (the packing's planes filled by DMA, `cudaHostRegister`).
On a healthy H100 host (2026-12-06) this took the Qwen3.5-35B-A3B shape's start-up from
62.6 to 25.6 s for its 64.4 GB of dummy experts and packing from 35.7 to 29.5-32.5 s; the
first touch stayed the largest part of packing (~4.4 GB/s on 16 threads).

`host_empty` allocates (zero-filled); `owns_mapping` says whether a tensor lies inside one
such live mapping; `resident_bytes` is this process's resident memory (for probes and
tests)."""

from __future__ import annotations

import math
import mmap
import threading
import weakref

import torch

from xinfer import envs

HUGE_PAGE = 2 << 20
# Below this a tensor keeps torch's allocator: rounding up to a huge page would waste up to
# 2 MiB of RAM per tensor, and small tensors are not what the link reads.
MIN_BYTES = 32 << 20


class LiveRanges:
    """Byte ranges `[start, end)` of host buffers, each forgotten once the object that owns
    it is collected. Buffers are made on a helper thread too (offload/setup.py host_sets):
    the ranges are read and changed under a lock."""

    def __init__(self) -> None:
        self._ranges: dict[int, tuple[int, weakref.ref]] = {}  # start → (end, owner)
        self._lock = threading.Lock()

    def add(self, start: int, end: int, owner: object) -> None:
        with self._lock:
            self._forget_dead()
            self._ranges[start] = (end, weakref.ref(owner))

    def holds(self, t: torch.Tensor) -> bool:
        """`t`'s bytes lie inside one live range (a host tensor's)."""
        if t.device.type != "cpu":
            return False
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()
        with self._lock:
            self._forget_dead()
            return any(s <= start and end <= e for s, (e, _) in self._ranges.items())

    def __contains__(self, start: int) -> bool:
        """A live range starts at `start`."""
        with self._lock:
            self._forget_dead()
            return start in self._ranges

    def _forget_dead(self) -> None:
        for start in [s for s, (_, ref) in self._ranges.items() if ref() is None]:
            del self._ranges[start]


_MAPPINGS = LiveRanges()  # the mappings `host_empty` made


def host_empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled host tensor; from a huge-page mapping of its own when it is at least
    MIN_BYTES, else from torch's allocator."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES:
        # the host, whatever a surrounding `with torch.device(...)` makes the default (the
        # model is built inside one: without `device` small experts landed on the GPU)
        return torch.zeros(shape, dtype=dtype, device="cpu")
    return _mapped(shape, dtype, nbytes, prefault=True)


def _mapped(
    shape, dtype: torch.dtype, nbytes: int, prefault: bool, advise_huge: bool | None = None
) -> torch.Tensor:
    """Huge pages from MIN_BYTES on; a smaller tensor gets 4 KiB pages (a huge page would
    hold up to 2 MiB of RAM for it). `prefault`: fault every page in now, on all of torch's
    threads (for a mapping whose first writer would be one thread: see the module
    docstring). `advise_huge`: ask for transparent huge pages (default:
    XINFER_HOST_HUGE_PAGES; bench/probe_first_touch.py times both)."""
    huge = nbytes >= MIN_BYTES
    align = HUGE_PAGE if huge else mmap.PAGESIZE
    size = -(-nbytes // align) * align + (align if huge else 0)  # + the slack to align
    buf = mmap.mmap(-1, size)
    if advise_huge is None:
        advise_huge = envs.XINFER_HOST_HUGE_PAGES()
    if huge and advise_huge:
        _advise(buf)
    start = torch.frombuffer(buf, dtype=torch.uint8, count=1).data_ptr()
    offset = (-start) % align
    # The storage itself starts at the aligned address (torch's is_pinned asks about the
    # storage's first byte); it keeps `buf` alive.
    out = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset)
    if prefault:
        out.zero_()  # the pages are zero already: this only makes the kernel provide them
    _MAPPINGS.add(start, start + size, buf)
    return out.view(dtype).view(shape)


def _advise(buf: mmap.mmap) -> None:
    """Ask for transparent huge pages (before any page of `buf` is touched)."""
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # THP compiled out: 4 KiB pages, still a mapping of its own
            pass


def owns_mapping(t: torch.Tensor) -> bool:
    """`t` lies inside a live mapping made by `host_empty` (its pages are no one else's)."""
    return _MAPPINGS.holds(t)


def copy_to_mapping(t: torch.Tensor) -> torch.Tensor:
    """A copy of host tensor `t` in a mapping of its own, whatever its size (the host store
    pins it in place): on huge pages from MIN_BYTES on."""
    if t.numel() == 0:
        return t.clone()
    nbytes = t.numel() * t.element_size()
    out = _mapped(tuple(t.shape), t.dtype, nbytes, prefault=False)
    out.copy_(t)  # faults the pages in on torch's threads itself
    return out


def resident_bytes() -> int | None:
    """This process's resident memory in bytes (Linux's /proc/self/statm), None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * mmap.PAGESIZE
    except OSError:
        return None
