"""The dummy weights' chunked copy of drawn experts into host tensors (weights/dummy.py):
the same values as drawing and copying an expert at a time, for every chunk size (tails
included), for bf16 and for a quantized format's several tensors an expert."""

from __future__ import annotations

import pytest
import quant_ckpt as qk
import tiny_models as tm
import torch

from xinfer.config import ModelConfig
from xinfer.runner.model_loader import build_model
from xinfer.weights.dummy import draw_experts


def _drawn(layer, chunked: bool, chunk_bytes: int, gen_device: str = "cpu") -> dict:
    for t in layer.expert_tensors.values():
        t.fill_(-7)  # nothing left from an earlier draw
    gen = torch.Generator(device=gen_device).manual_seed(11)
    dev = torch.device(gen_device)
    draw_experts(layer, gen, dev, chunk_bytes=chunk_bytes, chunked=chunked)
    return {k: t.clone() for k, t in layer.expert_tensors.items()}


def _host_layer(kind: str, tmp_path):
    """An MoE layer of a tiny model built on the CPU with `--load-format dummy`."""
    if kind == "bf16":
        path = tm.write_checkpoint(tm.make_hf_model("qwen3_moe"), tmp_path)
    else:
        _, path = qk.write_quantized("qwen3_moe", kind, tmp_path / kind, reference=False)
    cpu = torch.device("cpu")
    cfg = ModelConfig.from_dir(str(path))
    model = build_model(str(path), cfg, cpu, torch.float32, 64, cpu, "dummy", show_progress=False)
    return model.moe_layers()[0]


@pytest.mark.parametrize("kind", ["bf16", "gptq"])
def test_chunked_draw_equals_one_expert_at_a_time(kind, tmp_path):
    layer = _host_layer(kind, tmp_path)
    assert len(layer.expert_tensors) >= (2 if kind == "bf16" else 4)
    ref = _drawn(layer, chunked=False, chunk_bytes=0)
    per_expert = sum(t[0].numel() * t.element_size() for t in layer.expert_tensors.values())
    num_experts = layer.num_experts
    # one expert a chunk, a chunk that leaves a tail, all experts in one chunk
    for n in (1, 3, num_experts):
        assert num_experts % 3, "the 3-expert chunks must leave a tail"
        got = _drawn(layer, chunked=True, chunk_bytes=n * per_expert)
        for k in ref:
            assert torch.equal(got[k], ref[k]), (n, k)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "gptq"])
def test_chunked_draw_from_the_gpu_equals_one_expert_at_a_time(kind, tmp_path):
    """Drawn on the GPU into host experts: through the pinned buffer (asynchronous copies,
    then a stream sync) the same values as copied from the GPU an expert at a time."""
    layer = _host_layer(kind, tmp_path)
    ref = _drawn(layer, chunked=False, chunk_bytes=0, gen_device="cuda")
    per_expert = sum(t[0].numel() * t.element_size() for t in layer.expert_tensors.values())
    for n in (3, layer.num_experts):
        got = _drawn(layer, chunked=True, chunk_bytes=n * per_expert, gen_device="cuda")
        for k in ref:
            assert torch.equal(got[k], ref[k]), (n, k)
