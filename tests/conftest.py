"""Shared fixtures; `gpu` tests are skipped where CUDA is absent."""

from __future__ import annotations

import gc
import os

import pytest
import torch
from interpreter_child import start_children, stop_children


def pytest_collection_finish(session):
    """The interpreter children start now, beside the rest of the run (interpreter_child.py)."""
    if not session.config.option.collectonly:
        start_children(session.items)


def pytest_sessionfinish(session, exitstatus):
    stop_children()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords or "multi_gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    """Each engine sizes its KV cache from the free GPU memory: free the previous test's
    engines (reference cycles included) before the next one plans its cache."""
    yield
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _share_one_gpu(monkeypatch):
    """`scripts/gpu_run.sh gpushards` runs four pytest processes on one GPU: each engine sizes
    its caches from the free memory, so the first would take 90% of it and the others run out.
    XINFER_TEST_CACHE_GB (set by that phase) caps each engine's cache budget instead."""
    cap = os.environ.get("XINFER_TEST_CACHE_GB")
    if not cap:
        return
    from xinfer.engine import memory, state_cache

    uncapped = memory.gpu_kv_budget

    def capped(engine, device):
        return min(uncapped(engine, device), int(float(cap) * memory.GIB))

    monkeypatch.setattr(memory, "gpu_kv_budget", capped)
    monkeypatch.setattr(state_cache, "gpu_kv_budget", capped)
