"""XINFER_HOST_ALLOC=driver on a GPU: the CUDA driver's pinned, device-mapped memory holds
an expert tensor that the host store keeps as it is, the fill kernel (eager and in a CUDA
graph) and the copy engine read it bit for bit, an allocation on a helper thread (no
current context there) works, and the memory is returned when the tensor is gone."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from xinfer import host_alloc, host_memory
from xinfer.offload import kernels as offload_kernels
from xinfer.offload.host_store import HostExpertStore
from xinfer.offload.slot_cache import SlotCache

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
NUM_EXPERTS, ROW = 8, 3 * 1024 * 1024  # 8 experts of 6 MiB bf16: 48 MiB, above MIN_BYTES


@pytest.fixture
def driver_alloc(monkeypatch):
    if DEV is None:
        pytest.skip("needs CUDA")
    monkeypatch.setenv("XINFER_HOST_ALLOC", "driver")


def test_fill_kernel_and_copy_engine_read_driver_memory(driver_alloc):
    want = torch.randn(NUM_EXPERTS, ROW).to(torch.bfloat16)
    t = host_memory.host_empty((NUM_EXPERTS, ROW), torch.bfloat16)
    assert host_alloc.is_driver_pinned(t) and t.is_pinned()
    t.copy_(want)
    store = HostExpertStore(DEV)
    host = store.add_layer({"w": t})
    assert host["w"].data_ptr() == t.data_ptr()  # kept, not copied or registered
    cache = SlotCache(host, 3, DEV, num_overflow=0)
    cache.miss_ids[:3].copy_(torch.tensor([5, 1, 7], dtype=torch.int32))
    cache.miss_slots[:3].copy_(torch.arange(3, dtype=torch.int32))
    cache.miss_count.fill_(3)
    offload_kernels.fill(cache, host)
    torch.cuda.synchronize()
    assert torch.equal(cache.slots["w"][:3].cpu(), want[[5, 1, 7]])
    cache.slots["w"].zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        offload_kernels.fill(cache, host)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(cache.slots["w"][:3].cpu(), want[[5, 1, 7]])
    slot = torch.empty(ROW, dtype=torch.bfloat16, device=DEV)
    slot.copy_(t[2], non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(slot.cpu(), want[2])
    store.close()


def test_driver_memory_on_a_helper_thread_and_freed(driver_alloc):
    out: dict = {}

    def allocate() -> None:  # a fresh thread: no current CUDA context until we make one
        try:
            out["t"] = host_memory.host_empty((48 << 20,), torch.uint8)
        except Exception as e:  # noqa: BLE001 - reported below
            out["error"] = e

    worker = threading.Thread(target=allocate)
    worker.start()
    worker.join()
    assert "error" not in out, out.get("error")
    t = out.pop("t")
    assert host_alloc.is_driver_pinned(t) and int(t.sum()) == 0
    start = t.data_ptr()
    del t
    gc.collect()
    assert start not in host_alloc._LIVE  # the finalizer ran and freed it
