"""A host store closed while a CUDA graph is being captured (a dropped engine collected by
the garbage collector mid-capture) must not call cudaHostUnregister then: the capture forbids
it, and the call would break the capture. The unregistration waits for the next pin or close
outside a capture, and the pages stay known as registered (and their tensors alive) until
then. CPU: a recording stand-in for cudart; GPU: the real thing, garbage collected inside a
capture."""

from __future__ import annotations

import gc

import pytest
import torch

from xinfer.offload import host_store
from xinfer.runner.cuda_graph import gc_paused


class RecordingCudart:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def cudaHostRegister(self, ptr, nbytes, flags):  # noqa: N802 (cudart's name)
        self.calls.append(("register", ptr))
        return 0

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.calls.append(("unregister", ptr))
        return 0


@pytest.fixture
def fake_cuda(monkeypatch):
    cudart = RecordingCudart()
    capturing = {"on": False}
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(host_store, "_capturing", lambda: capturing["on"])
    monkeypatch.setattr(host_store, "_REGISTERED", [])
    monkeypatch.setattr(host_store, "_DEFERRED", [])
    return cudart, capturing


def pinned_store(n: int = 3) -> host_store.HostExpertStore:
    store = host_store.HostExpertStore(torch.device("cpu"))
    for i in range(n):  # `add_layer` pins only on CUDA: pin by hand through the stand-in
        store.layers.append({"w": store.pin_after_fill(torch.full((4, 1024), float(i)))})
    return store


def test_close_during_capture_defers_until_the_capture_ends(fake_cuda):
    cudart, capturing = fake_cuda
    store = pinned_store()
    ptrs = [ptr for _, ptr in cudart.calls]
    assert len(host_store._REGISTERED) == 3
    capturing["on"] = True
    store.close()
    assert [c for c, _ in cudart.calls] == ["register"] * 3, "unregistered inside a capture"
    assert len(host_store._DEFERRED) == 3 and len(host_store._REGISTERED) == 3
    kept = host_store._DEFERRED[0][2]
    assert kept[0]["w"][0, 0].item() == 0.0  # the tensors stay alive while registered
    host_store.unregister_deferred()  # still capturing: nothing yet
    assert len(host_store._DEFERRED) == 3
    capturing["on"] = False
    later = pinned_store(1)  # the next pin drops the deferred registrations first
    unregistered = [ptr for c, ptr in cudart.calls if c == "unregister"]
    assert unregistered == ptrs
    assert host_store._DEFERRED == [] and len(host_store._REGISTERED) == 1
    later.close()


def test_close_outside_a_capture_unregisters_at_once(fake_cuda):
    cudart, _ = fake_cuda
    store = pinned_store(2)
    store.close()
    assert [c for c, _ in cudart.calls] == ["register", "register", "unregister", "unregister"]
    assert host_store._REGISTERED == [] and host_store._DEFERRED == []
    store.close()  # twice: nothing more
    assert len(cudart.calls) == 4


def test_gc_paused_restores_the_collector_state():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled(), "a collector disabled before stays disabled"
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("capture failed")
    assert gc.isenabled()


@pytest.mark.gpu
def test_store_collected_inside_a_capture_leaves_the_capture_whole():
    dev = torch.device("cuda", 0)
    # Earlier garbage first: cycles left by other tests (an engine whose failure traceback
    # holds its frames) may own CUDA graphs, whose reset a capture forbids; only the store's
    # cycle is this test's to collect inside the capture.
    gc.collect()
    store = host_store.HostExpertStore(dev)
    store.add_layer({"w": torch.randn(8, 4096)})
    cycle = {"store": store}
    cycle["self"] = cycle  # only the cyclic collector can free it
    del store, cycle
    x = torch.ones(1024, device=dev)
    y = x * 2  # warm the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gc.collect()  # what the collector may do at any allocation: close the store
        y = x * 2
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(x, 2.0))
    assert host_store._DEFERRED, "the store's unregistration waits for the capture's end"
    host_store.unregister_deferred()
    assert not host_store._DEFERRED
