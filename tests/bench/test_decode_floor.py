"""The decode floor's byte count (bench/bench_decode.py) against the figure in
ANCHORS.md: Qwen3-30B-A3B at batch 1 reads ~3.04 B active parameters ≈ 6.1 GB a token."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_step_bytes_matches_anchor():
    sys.path.insert(0, str(BENCH))
    from bench_decode import step_bytes

    from xinfer.config import ModelConfig

    cfg = ModelConfig.from_dir(BENCH / "configs" / "qwen3_30b_a3b")
    one = step_bytes(cfg, batch=1, context=0)
    assert 6.0e9 < one < 6.2e9
    # more sequences touch more distinct experts, never more than all of them
    assert step_bytes(cfg, 8, 0) > one
    all_experts = cfg.num_layers * cfg.num_experts * cfg.expert_bytes(torch.bfloat16)
    assert step_bytes(cfg, 10_000, 0) - one < all_experts
