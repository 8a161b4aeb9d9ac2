"""Pre-load memory checks: the weight plan (built on the meta device, in the checkpoint's
formats) and the one-sentence error when the GPU (or its --gpu-memory-limit-gb) cannot
hold the weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from xinfer.config import ModelConfig
from xinfer.engine import memory
from xinfer.errors import UserError
from xinfer.offload.host_store import expert_host_bytes
from xinfer.runner.model_loader import plan_weights

QWEN3_30B = Path(__file__).resolve().parents[2] / "bench" / "configs" / "qwen3_30b_a3b"
GIB = 1 << 30


def test_resident_bytes_with_and_without_experts():
    cfg = ModelConfig.from_dir(str(QWEN3_30B))
    full = plan_weights(cfg, torch.bfloat16, 4096, offload=False)
    rest = plan_weights(cfg, torch.bfloat16, 4096, offload=True)
    assert full.device_bytes - rest.device_bytes == expert_host_bytes(cfg, torch.bfloat16)
    assert rest.host_expert_bytes == expert_host_bytes(cfg, torch.bfloat16)
    assert 56 * GIB < full.device_bytes < 58 * GIB  # the 30.5B-parameter shape in bf16
    assert 2.5 * GIB < rest.device_bytes < 3.5 * GIB  # embeddings, LM head, attention, ...
    assert rest.expert_bytes == 3 * 2048 * 768 * 2  # 9.44 MB


@pytest.mark.parametrize(
    "qc,expert_bytes",
    [
        # e4m3 weights + a float32 scale per 128x128 block: gate|up 12 x 16, down 16 x 6
        ({"quant_method": "fp8", "weight_block_size": [128, 128]},
         3 * 2048 * 768 + (12 * 16 + 16 * 6) * 4),
        # int4 codes + fp16 scales per 128 columns: gate|up (1536 x 16), down (2048 x 6)
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True},
         3 * 2048 * 768 // 2 + (1536 * 16 + 2048 * 6) * 2),
        # e2m1 codes + e4m3 scale per 16 columns + a float32 global per row
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"},
         3 * 2048 * 768 // 2 + 3 * 2048 * 768 // 16 + (1536 + 2048) * 4),
    ],
)  # fmt: skip
def test_quantized_checkpoints_plan_their_stored_bytes(qc, expert_bytes):
    hf = {**ModelConfig.from_dir(str(QWEN3_30B)).hf_config, "quantization_config": qc}
    cfg = ModelConfig.from_hf(hf)
    plan = plan_weights(cfg, torch.bfloat16, 4096, offload=True)
    assert plan.expert_bytes == expert_bytes
    assert plan.host_expert_bytes == 48 * 128 * expert_bytes
    bf16 = plan_weights(ModelConfig.from_dir(str(QWEN3_30B)), torch.bfloat16, 4096, True)
    assert plan.device_bytes < bf16.device_bytes  # attention is quantized too, routers not


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


def test_blocks_cached_by_torch_count_as_free(monkeypatch):
    """An earlier engine's freed blocks, still held by torch's caching allocator, are ours to
    reuse: the budget counts them as free (the driver's free figure does not)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 30 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 24 * GIB)
    cuda = torch.device("cuda")
    assert memory.usable_gpu_bytes(cuda, None) == 16 * GIB
    # a 24 GB limit: 80 - 16 = 64 GB in use by live tensors and others, more than the limit
    assert memory.usable_gpu_bytes(cuda, 24.0) == 0
    assert memory.usable_gpu_bytes(cuda, 72.0) == 8 * GIB


def test_kv_shortfall_names_the_start_up_steps_that_took_memory():
    """A KV cache short of one sequence under offload says how much start-up took after the
    slot plan, step by step; nothing where offload is off or too little went missing."""
    from xinfer.engine.memory import kv_shortfall_reason

    gib = 1 << 30
    free = {
        "weights": 9 * gib,
        "offload plan": 3 * gib,
        "offload": 3 * gib - (100 << 20),
        "state slots": 3 * gib - (100 << 20),
        "routing": 3 * gib - (150 << 20),
        "kv sizing": 3 * gib - (150 << 20),
    }
    text = kv_shortfall_reason(free, is_offload=True, is_auto=True)
    assert "took 0.15 GB" in text
    assert "offload 0.10 GB" in text and "routing 0.05 GB" in text
    assert "weights" not in text  # before the plan: not what the plan missed
    assert "--moe-offload-reserve-gb" in text
    fraction = kv_shortfall_reason(free, is_offload=True, is_auto=False)
    assert "a smaller --moe-offload fraction" in fraction and "reserve" not in fraction
    assert kv_shortfall_reason(free, is_offload=False, is_auto=False) == ""
    small = dict(free, **{"kv sizing": 3 * gib - (8 << 20), "routing": 3 * gib})
    small["offload"] = small["state slots"] = 3 * gib
    assert kv_shortfall_reason(small, is_offload=True, is_auto=True) == ""
    assert kv_shortfall_reason({"weights": gib}, is_offload=True, is_auto=True) == ""
