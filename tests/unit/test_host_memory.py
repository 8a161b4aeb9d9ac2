"""Host memory for large tensors (xinfer/host_memory.py): mappings of their own, aligned to
2 MiB, advised as huge pages unless XINFER_HOST_HUGE_PAGES=0; small tensors keep torch's
allocator; the registry of live mappings forgets freed ones; a large tensor's pages are
resident when it is made."""

from __future__ import annotations

import gc
import mmap

import pytest
import torch

from xinfer import host_memory
from xinfer.errors import UserError
from xinfer.host_memory import (
    HUGE_PAGE,
    MIN_BYTES,
    copy_to_mapping,
    host_empty,
    owns_mapping,
    resident_bytes,
)


def test_large_tensor_gets_an_aligned_mapping_of_its_own():
    shape = (3, MIN_BYTES // 2 // 3 + 5)  # bf16: just over MIN_BYTES, not a whole huge page
    t = host_empty(shape, torch.bfloat16)
    assert t.shape == shape and t.dtype == torch.bfloat16
    assert t.data_ptr() % HUGE_PAGE == 0
    assert t.untyped_storage().data_ptr() == t.data_ptr()  # is_pinned asks about this byte
    assert owns_mapping(t) and owns_mapping(t[1]) and owns_mapping(t[:, 7:9])
    assert not torch.any(t)  # zero-filled
    t[2, -1] = 1.5
    assert float(t.float().sum()) == 1.5


def test_small_tensor_keeps_torchs_allocator():
    t = host_empty((4, 8), torch.float32)
    assert not owns_mapping(t) and not torch.any(t)
    assert not owns_mapping(torch.empty(MIN_BYTES, dtype=torch.uint8))


@pytest.mark.parametrize("nbytes", [64, MIN_BYTES], ids=["small", "large"])
def test_host_tensors_stay_on_the_host_under_another_default_device(nbytes):
    """The model is built inside `with torch.device(gpu)`: offloaded experts must still be
    made on the host (a small one made without `device` landed on the GPU, and offload then
    ran every layer resident; meta stands in for the GPU here)."""
    with torch.device("meta"):
        t = host_empty((nbytes // 4,), torch.float32)
    assert t.device.type == "cpu" and not torch.any(t)


def test_copy_to_mapping_is_equal_and_owned():
    src = torch.randn(1000, 37)  # small: 4 KiB pages of its own
    out = copy_to_mapping(src)
    assert torch.equal(out, src) and owns_mapping(out) and not owns_mapping(src)
    assert out.data_ptr() % mmap.PAGESIZE == 0
    big = torch.randint(0, 255, (MIN_BYTES + 3,), dtype=torch.uint8)
    out = copy_to_mapping(big)
    assert torch.equal(out, big) and owns_mapping(out) and out.data_ptr() % HUGE_PAGE == 0
    empty = torch.empty(0, 5)
    assert copy_to_mapping(empty).shape == (0, 5)


def test_freed_mappings_are_forgotten():
    t = host_empty((MIN_BYTES,), torch.uint8)
    start = t.data_ptr()
    assert owns_mapping(t)
    del t
    gc.collect()
    assert start not in host_memory._MAPPINGS


@pytest.mark.parametrize("env, advised", [(None, True), ("1", True), ("0", False)])
def test_huge_page_advice_follows_the_environment(monkeypatch, env, advised):
    calls = []
    real = mmap.mmap

    def recording_mmap(*args):
        buf = real(*args)
        calls.append(buf)
        return buf

    advice = []
    monkeypatch.setattr(host_memory.mmap, "mmap", recording_mmap)
    monkeypatch.setattr(host_memory, "_advise", advice.append)
    if env is None:
        monkeypatch.delenv("XINFER_HOST_HUGE_PAGES", raising=False)
    else:
        monkeypatch.setenv("XINFER_HOST_HUGE_PAGES", env)
    t = host_empty((MIN_BYTES,), torch.uint8)
    assert len(calls) == 1 and owns_mapping(t)
    assert advice == (calls if advised else [])
    copy_to_mapping(torch.zeros(1000))  # small: never advised
    assert advice == (calls[:1] if advised else []) and len(calls) == 2


def test_bad_environment_value_is_refused(monkeypatch):
    monkeypatch.setenv("XINFER_HOST_HUGE_PAGES", "maybe")
    with pytest.raises(UserError, match="XINFER_HOST_HUGE_PAGES must be 1 or 0"):
        host_empty((MIN_BYTES,), torch.uint8)


@pytest.mark.skipif(resident_bytes() is None, reason="Linux's /proc only")
def test_a_large_tensor_is_resident_when_made():
    """Its pages are faulted in at once (on torch's threads), not by its first writer."""
    before = resident_bytes()
    t = host_empty((MIN_BYTES * 2,), torch.uint8)
    assert resident_bytes() - before >= MIN_BYTES * 2 * 0.9
    assert not torch.any(t)


def test_mappings_made_on_another_thread_beside_owns_mapping():
    """offload/setup.py host_sets makes mappings on a helper thread while the main thread
    asks owns_mapping: the registry of live mappings is read and changed under a lock
    (without it: "dictionary changed size during iteration")."""
    import sys
    import threading

    keep = [host_memory._mapped((4096,), torch.uint8, 4096, False) for _ in range(64)]
    errors, done = [], threading.Event()

    def make():
        try:
            for _ in range(3000):
                host_memory._mapped((4096,), torch.uint8, 4096, False)  # dropped at once
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        maker = threading.Thread(target=make)
        maker.start()
        while not done.is_set():
            for t in keep[:8]:
                assert owns_mapping(t)
        maker.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
