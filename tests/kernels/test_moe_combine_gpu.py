"""The decode MoE GEMVs' fused combine on the GPU (`fused_moe.combine_when_last`): each token
tile's last program reads the other programs' y tiles after an acquire on its counter, which
the CPU interpreter (one program at a time) cannot test. Here, at the Qwen3-30B-A3B layer
widths, for every kernel family: the fused output equals the separate combine kernel's bit
for bit on many launches in a row, the counters are zero after them, and a CUDA graph with
the fused launch replays to the same bits. All `gpu`: skipped without CUDA."""

from __future__ import annotations

import functools

import pytest
import torch
from fused_tails import assert_graph_replays, assert_launches_repeat
from moe_families import FAMILIES, run_combined

pytestmark = pytest.mark.gpu


@pytest.fixture
def run(monkeypatch):
    pytest.importorskip("triton")
    from xinfer.kernels import moe_launch

    return lambda call, fused: run_combined(moe_launch, monkeypatch, call, fused)


def _call(family: str, tokens: int, seed: int):
    make = functools.partial(FAMILIES[family], device="cuda", large=True)
    return make(tokens, 8, torch.bfloat16, seed)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_fused_combine_has_the_separate_combines_bits(run, family, tokens) -> None:
    assert_launches_repeat(run, _call(family, tokens, seed=tokens))


@pytest.mark.parametrize("family", ["float-kernels", "fp8", "gguf-q4_k-q6_k"])
def test_fused_combine_replays_in_a_cuda_graph(run, family) -> None:
    assert_graph_replays(run, _call(family, 4, seed=9))
