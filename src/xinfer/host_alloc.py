"""Host memory that the CUDA driver allocates pinned and device-mapped (`cuMemHostAlloc`,
portable + device-map), for the large host tensors the GPU reads through the link (routed
experts under offload), chosen with `XINFER_HOST_ALLOC=driver`. The default
(`XINFER_HOST_ALLOC=register`) keeps xinfer/host_memory.py's anonymous huge-page mappings,
which the host store pins after they are filled (`cudaHostRegister`).

Why offer it: on some H100 hosts whose IOMMU translates DMA, memory registered with
`cudaHostRegister` was read at about half the link's rate, by the SM fill kernel (27-34
GB/s) and by the copy engine alike (~20 GB/s for the store's per-expert copies), while the
same copy engine read `cudaHostAlloc` memory at 53-55 GB/s (bench/NOTES.md, eighteenth and
twenty-fourth sessions). On a healthy host every kind of pinned memory read the same
(50-51 GB/s by the fill kernel, nineteenth session). Whether the fill kernel reads driver
memory at the copy engine's rate on a slow host is not measured yet
(`bench/bench_offload_fill.py --host-memory`).

`driver_empty` allocates (zero-filled); the memory is freed when the last tensor viewing it
is gone (deferred while a CUDA graph is being captured: freeing pinned memory then would
break the capture). `is_driver_pinned` says whether a tensor lies in such memory, which the
host store then neither copies nor registers."""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref

import torch

from xinfer.cuda_driver import DriverError, check, libcuda
from xinfer.errors import UserError
from xinfer.host_memory import LiveRanges

_CU_MEMHOSTALLOC_PORTABLE = 0x01
_CU_MEMHOSTALLOC_DEVICEMAP = 0x02
_LIVE = LiveRanges()  # the allocations `driver_empty` made, while their buffers live
_DEFERRED: list[int] = []  # frees deferred during a capture, under _LOCK
_LOCK = threading.Lock()


class HostAllocError(UserError):
    """The driver refused the memory (RAM): the user's to fix, in one sentence."""


@functools.cache
def _libcuda() -> ctypes.CDLL:
    lib = libcuda()
    lib.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    lib.cuMemFreeHost.argtypes = [ctypes.c_void_p]
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    lib.cuDevicePrimaryCtxGetState.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_uint),
        ctypes.POINTER(ctypes.c_int),
    ]
    return lib


def _check(result: int, what: str) -> None:
    check(result, what, _libcuda())


def _ensure_context() -> None:
    """The driver's calls need a current context on this thread (helper threads have none):
    the primary context this process already made active (a tensor-parallel rank's own
    device, never another's), else torch's current device's."""
    torch.cuda.init()
    lib = _libcuda()
    ctx = ctypes.c_void_p()
    _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if ctx.value:
        return
    primary = ctypes.c_void_p()
    retained = lib.cuDevicePrimaryCtxRetain(ctypes.byref(primary), _active_device())
    _check(retained, "cuDevicePrimaryCtxRetain")
    _check(lib.cuCtxSetCurrent(primary), "cuCtxSetCurrent")


def _active_device() -> int:
    """The first device whose primary context is active in this process (the driver's
    handle), else torch's current device's."""
    lib = _libcuda()
    count = ctypes.c_int()
    _check(lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    handle, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    for ordinal in range(count.value):
        _check(lib.cuDeviceGet(ctypes.byref(handle), ordinal), "cuDeviceGet")
        state = lib.cuDevicePrimaryCtxGetState(handle, ctypes.byref(flags), ctypes.byref(active))
        _check(state, "cuDevicePrimaryCtxGetState")
        if active.value:
            return handle.value
    _check(lib.cuDeviceGet(ctypes.byref(handle), torch.cuda.current_device()), "cuDeviceGet")
    return handle.value


def _capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except Exception:  # noqa: BLE001 - interpreter shutdown, no CUDA: nothing captures
        return False


def _free(ptr: int) -> None:
    """Free one allocation, or defer it while a capture runs (called by the finalizer of
    the buffer object that owns it)."""
    with _LOCK:
        if _capturing():
            _DEFERRED.append(ptr)
            return
    try:
        _ensure_context()  # the collector may run this on any thread
        _libcuda().cuMemFreeHost(ctypes.c_void_p(ptr))
    except Exception:  # noqa: BLE001 - at interpreter shutdown the driver may be gone
        pass


def free_deferred() -> None:
    """Free what was released during a capture (outside one)."""
    if _capturing():
        return
    with _LOCK:
        pending, _DEFERRED[:] = list(_DEFERRED), []
    if pending:
        _ensure_context()
    for ptr in pending:
        _libcuda().cuMemFreeHost(ctypes.c_void_p(ptr))


def driver_empty(
    shape: tuple[int, ...] | torch.Size, dtype: torch.dtype, zero: bool = True
) -> torch.Tensor:
    """A host tensor in pinned, device-mapped memory from the CUDA driver, zero-filled
    unless `zero` is False (a caller that overwrites it all); a refusal (RAM) raises
    HostAllocError naming the size."""
    free_deferred()
    nbytes = max(1, int(torch.Size(shape).numel()) * dtype.itemsize)
    _ensure_context()
    ptr = ctypes.c_void_p()
    flags = _CU_MEMHOSTALLOC_PORTABLE | _CU_MEMHOSTALLOC_DEVICEMAP
    try:
        _check(_libcuda().cuMemHostAlloc(ctypes.byref(ptr), nbytes, flags), "cuMemHostAlloc")
    except DriverError as e:
        raise HostAllocError(
            f"the CUDA driver could not allocate {nbytes / 2**30:.2f} GiB of pinned host memory "
            f"({e}); free host RAM or unset XINFER_HOST_ALLOC"
        ) from None
    start = ptr.value
    buf = (ctypes.c_uint8 * nbytes).from_address(start)
    weakref.finalize(buf, _free, start)  # when the last tensor over `buf` is gone
    _LIVE.add(start, start + nbytes, buf)
    out = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes)
    if zero:
        out.zero_()  # the driver says nothing of the contents; the pages are pinned: fast
    return out[: int(torch.Size(shape).numel()) * dtype.itemsize].view(dtype).view(shape)


def is_driver_pinned(t: torch.Tensor) -> bool:
    """`t` lies inside a live `driver_empty` allocation."""
    return _LIVE.holds(t)
