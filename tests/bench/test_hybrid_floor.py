"""The hybrid decode floor's byte count (bench/bench_hybrid.py) for the Qwen3.5-35B-A3B shape,
against a count by hand: per token, every weight but the embedding table (2.38 B non-expert
parameters: 30 Gated DeltaNet layers of 33.7 M, 10 gated-attention layers of 27.3 M, 40
routers, shared experts and norms of 3.7 M, a 508.6 M LM head) plus 8 of 256 experts in each of 40
layers (1.5 M parameters each) in bf16, and the recurrent state read and written."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_floor_bytes_of_the_qwen3_5_shape():
    sys.path.insert(0, str(BENCH))
    from bench_hybrid import floor_bytes

    from xinfer.config import ModelConfig
    from xinfer.models.registry import get_model_class

    cfg = ModelConfig.from_dir(BENCH / "configs" / "qwen3_5_35b_a3b")
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # the model's dtype, as the engine builds it
    try:
        with torch.device("meta"):
            model = get_model_class(cfg.architecture)(cfg, 4096, torch.device("meta"))
    finally:
        torch.set_default_dtype(default)
    # in_proj_qkvz, in_proj_ba, conv, out_proj, dt_bias, A_log, gated norm
    linear = 2048 * (8192 + 4096 + 64) + 8192 * 4 + 4096 * 2048 + 32 * 2 + 128
    attention = 2048 * (8192 + 1024) + 4096 * 2048 + 2 * 256
    moe = 2048 * 256 + 3 * 2048 * 512 + 2048 + 2 * 2048
    dense = 30 * linear + 10 * attention + 40 * moe + 248320 * 2048 + 2048
    experts = 40 * 8 * 3 * 2048 * 512
    state = 2 * cfg.state_bytes_per_seq(torch.bfloat16)
    want = 2 * (dense + experts) + 30 * 32 * 2 + state  # A_log is float32: 2 more bytes
    got = floor_bytes(model, cfg, torch.bfloat16, batch=1, context=0)
    assert abs(got - want) < 1e-6 * want, (got, want)
    assert 5.9e9 < got < 6.3e9
