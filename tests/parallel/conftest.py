"""Helpers for the tensor-parallel tests: engines of 2 CPU ranks (gloo), each closed (its
follower process stopped) before the next starts — one TP engine per process at a time."""

from __future__ import annotations

import dense_models as dm
import pytest
import tiny_models as tm

from xinfer import LLM


@pytest.fixture
def tp_llm():
    """`tp_llm(path, **options)` → an LLM over `cpu,cpu`, closed after the test."""
    made: list[LLM] = []

    def make(path, **options) -> LLM:
        options.setdefault("dtype", "float32")
        llm = LLM(str(path), device="cpu,cpu", **options)
        made.append(llm)
        return llm

    yield make
    for llm in made:
        llm.close()


def checkpoint(tmp_path_factory, arch: str, layout: str = "per_expert", **overrides):
    """A tiny checkpoint of a MoE / hybrid (tiny_models) or dense (dense_models) model."""
    if arch in dm.DENSE:
        model = dm.make_dense(arch, seed=5, **overrides)
    else:
        model = tm.make_hf_model(arch, seed=5, **overrides)
    return tm.write_checkpoint(model, tmp_path_factory.mktemp(f"tp-{arch}-{layout}"), layout)
