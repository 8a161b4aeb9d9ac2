"""Helpers for the tensor-parallel tests: engines of 2 CPU ranks (gloo), each closed (its
follower process stopped) before the next starts — one TP engine per process at a time."""

from __future__ import annotations

import pytest

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
