"""XINFER_HOST_ALLOC=driver (xinfer/host_alloc.py): large host tensors from the CUDA
driver's pinned memory. On CPU the driver is a fake that hands out ordinary memory, so what
is checked here is the bookkeeping: zero-filled tensors of the asked shape, which tensors
count as driver-pinned, the host store keeping them without registering, frees when the
last view is gone (deferred during a capture), and the refusals."""

from __future__ import annotations

import ctypes
import gc

import pytest
import torch

from xinfer import UserError, envs, host_alloc, host_memory
from xinfer.offload.host_store import HostExpertStore

MB = 1 << 20


class FakeDriver:
    """cuMemHostAlloc / cuMemFreeHost over ctypes buffers (filled with 0x5A: the engine
    must zero them itself); counts allocations and frees."""

    def __init__(self) -> None:
        self.buffers: dict[int, ctypes.Array] = {}
        self.freed: list[int] = []
        self.refuse = False

    def cuMemHostAlloc(self, pp, nbytes, flags) -> int:
        if self.refuse:
            return 2  # CUDA_ERROR_OUT_OF_MEMORY
        assert flags == 0x03  # portable | device-map
        buf = ctypes.create_string_buffer(b"\x5a" * nbytes, nbytes)
        addr = ctypes.addressof(buf)
        self.buffers[addr] = buf
        pp._obj.value = addr
        return 0

    def cuMemFreeHost(self, ptr) -> int:
        addr = ptr.value
        self.freed.append(addr)
        del self.buffers[addr]
        return 0

    has_context = True  # a current context on the calling thread
    active_device = 1  # the one primary context this process made active
    retained: list[int] = []

    def cuCtxGetCurrent(self, pctx) -> int:
        pctx._obj.value = 1 if self.has_context else None
        return 0

    def cuDeviceGetCount(self, pcount) -> int:
        pcount._obj.value = 2
        return 0

    def cuDeviceGet(self, phandle, ordinal) -> int:
        phandle._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxGetState(self, handle, pflags, pactive) -> int:
        pactive._obj.value = int(handle.value == self.active_device)
        return 0

    def cuDevicePrimaryCtxRetain(self, pctx, handle) -> int:
        self.retained = [*self.retained, handle]
        pctx._obj.value = 7
        return 0

    def cuCtxSetCurrent(self, ctx) -> int:
        self.has_context = True
        return 0

    def cuGetErrorName(self, result, pname) -> int:
        pname._obj.value = b"CUDA_ERROR_OUT_OF_MEMORY"
        return 0


@pytest.fixture
def driver(monkeypatch):
    gc.collect()  # nothing of another test's is freed through this fake
    fake = FakeDriver()
    monkeypatch.setattr(host_alloc, "_libcuda", lambda: fake)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(host_alloc, "_capturing", lambda: False)
    monkeypatch.setenv("XINFER_HOST_ALLOC", "driver")
    yield fake
    gc.collect()
    host_alloc.free_deferred()
    assert not fake.buffers, "a driver allocation outlived its test"


def test_the_option_is_checked(monkeypatch):
    monkeypatch.delenv("XINFER_HOST_ALLOC", raising=False)
    assert envs.XINFER_HOST_ALLOC() == "register"
    monkeypatch.setenv("XINFER_HOST_ALLOC", "Driver")
    assert envs.XINFER_HOST_ALLOC() == "driver"
    monkeypatch.setenv("XINFER_HOST_ALLOC", "hugepages")
    with pytest.raises(UserError, match="XINFER_HOST_ALLOC must be one of register, driver"):
        envs.XINFER_HOST_ALLOC()


def test_driver_memory_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("XINFER_HOST_ALLOC", "driver")
    with pytest.raises(UserError, match="it needs an NVIDIA GPU; unset it"):
        host_memory.host_empty((64, MB), torch.uint8)
    small = host_memory.host_empty((4, 4), torch.float32)  # small tensors never ask
    assert not host_alloc.is_driver_pinned(small)


def test_large_tensors_come_from_the_driver_zeroed(driver):
    t = host_memory.host_empty((3, 16 * MB // 2), torch.bfloat16)
    assert t.shape == (3, 8 * MB) and t.dtype == torch.bfloat16
    assert int(t.view(torch.int16).abs().sum()) == 0  # the fake's 0x5A bytes were zeroed
    assert host_alloc.is_driver_pinned(t) and host_alloc.is_driver_pinned(t[1])
    assert not host_memory.owns_mapping(t)
    assert len(driver.buffers) == 1
    small = host_memory.host_empty((8, 8), torch.bfloat16)
    assert not host_alloc.is_driver_pinned(small) and len(driver.buffers) == 1
    src = torch.randn(40 * MB // 4)
    copy = host_memory.copy_to_mapping(src)
    assert torch.equal(copy, src) and host_alloc.is_driver_pinned(copy)
    assert not host_alloc.is_driver_pinned(src)


def test_a_thread_without_context_takes_the_active_device(driver, monkeypatch):
    """A helper thread has no current context: the allocation makes current the primary
    context the process already uses (device 1 here, as a tensor-parallel rank's), not
    torch's default device 0, which would cost another context on someone else's GPU."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    driver.has_context = False
    t = host_memory.host_empty((40 * MB,), torch.uint8)
    assert driver.retained == [1] and driver.has_context
    assert host_alloc.is_driver_pinned(t)
    del t


def test_the_store_keeps_driver_memory_as_it_is(driver, monkeypatch):
    def no_register(*a, **k):
        raise AssertionError("driver memory must not be registered")

    monkeypatch.setattr("xinfer.offload.host_store._register", no_register)
    t = host_memory.host_empty((2, 48 * MB // 2), torch.bfloat16)
    t[1].fill_(1.5)
    store = HostExpertStore(torch.device("cuda", 0))
    kept = store.add_layer({"w": t})["w"]
    assert kept.data_ptr() == t.data_ptr() and torch.equal(kept, t)
    assert store.pin_after_fill(t) is t
    store.close()


def test_freed_with_the_last_view_and_deferred_during_a_capture(driver, monkeypatch):
    t = host_memory.host_empty((32 * MB,), torch.uint8)
    view = t[MB:]
    addr = t.data_ptr()
    del t
    gc.collect()
    assert driver.freed == [] and host_alloc.is_driver_pinned(view)  # a view keeps it
    del view
    gc.collect()
    assert driver.freed == [addr] and not driver.buffers
    u = host_memory.host_empty((32 * MB,), torch.uint8)
    addr = u.data_ptr()  # (may be the freed one's: compare counts, not addresses)
    monkeypatch.setattr(host_alloc, "_capturing", lambda: True)
    del u
    gc.collect()
    assert len(driver.freed) == 1 and driver.buffers  # not while a graph is captured
    host_alloc.free_deferred()
    assert len(driver.freed) == 1  # still capturing
    monkeypatch.setattr(host_alloc, "_capturing", lambda: False)
    host_alloc.free_deferred()
    assert driver.freed == [driver.freed[0], addr] and not driver.buffers


def test_a_refusal_is_one_sentence(driver):
    driver.refuse = True
    with pytest.raises(
        host_alloc.HostAllocError, match="could not allocate 0.06 GiB .* unset XINFER_HOST_ALLOC"
    ):
        host_memory.host_empty((64 * MB,), torch.uint8)
