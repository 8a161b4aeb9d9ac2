"""Shared fixtures; `gpu` tests are skipped where CUDA is absent."""

from __future__ import annotations

import gc

import pytest
import torch


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
