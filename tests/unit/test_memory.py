"""Pre-load memory checks: the resident weight count (built on the meta device) and the
one-sentence error when the GPU (or its --gpu-memory-limit-gb) cannot hold the weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from xinfer.config import ModelConfig
from xinfer.engine import memory
from xinfer.errors import UserError
from xinfer.offload.host_store import expert_host_bytes
from xinfer.runner.model_loader import resident_weight_bytes

QWEN3_30B = Path(__file__).resolve().parents[2] / "bench" / "configs" / "qwen3_30b_a3b"
GIB = 1 << 30


def test_resident_bytes_with_and_without_experts():
    cfg = ModelConfig.from_dir(str(QWEN3_30B))
    full = resident_weight_bytes(cfg, torch.bfloat16, 4096, include_experts=True)
    rest = resident_weight_bytes(cfg, torch.bfloat16, 4096, include_experts=False)
    assert full - rest == expert_host_bytes(cfg, torch.bfloat16)
    assert 56 * GIB < full < 58 * GIB  # the 30.5B-parameter shape in bf16
    assert 2.5 * GIB < rest < 3.5 * GIB  # embeddings, LM head, attention, routers, norms


def test_weights_that_do_not_fit_name_the_offload_fix(monkeypatch):
    monkeypatch.setattr(memory, "usable_gpu_bytes", lambda device, limit: 23 * GIB)
    cuda = torch.device("cuda")
    memory.check_weights_fit(20 * GIB, cuda, 24.0, is_moe=True)  # fits: no error
    with pytest.raises(UserError, match=r"need 57\.0 GB .* only 23\.0 GB is free "
                       r"\(--gpu-memory-limit-gb 24\); .*XINFER_MOE_OFFLOAD=auto"):  # fmt: skip
        memory.check_weights_fit(57 * GIB, cuda, 24.0, is_moe=True)
    with pytest.raises(UserError, match="a GPU with more memory or a smaller model"):
        memory.check_weights_fit(57 * GIB, cuda, None, is_moe=False)
    memory.check_weights_fit(10**15, torch.device("cpu"), None, is_moe=True)  # CPU: no check
