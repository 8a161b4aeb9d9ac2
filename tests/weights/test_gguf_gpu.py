"""GPU: GGUF blocks dequantized on the GPU (as the loader does there) equal the CPU twins
bit for bit; a tiny MoE GGUF runs in CUDA graphs with the same greedy tokens at every
offload fraction."""

from __future__ import annotations

import gguf_files as gf
import numpy as np
import pytest
import tiny_models as tm
import torch

from xinfer.quant.gguf_blocks import BLOCK_TYPES, dequantize

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", sorted(BLOCK_TYPES))
def test_gpu_dequantize_equals_cpu_twin(name):
    raw = torch.from_numpy(gf.random_blocks(name, 64, 1024, np.random.default_rng(3)))
    cpu = dequantize(raw, BLOCK_TYPES[name], 1024)
    gpu = dequantize(raw.cuda(), BLOCK_TYPES[name], 1024).cpu()
    assert torch.equal(cpu.view(torch.int32), gpu.view(torch.int32))


def test_gguf_moe_graphs_identical_across_fractions(tmp_path):
    from xinfer import LLM, SamplingParams

    hf = tm.make_hf_model("qwen3_moe", mlp_only_layers=[])
    meta = dict(expert_count=8, expert_used_count=2, expert_feed_forward_length=32)
    path = gf.write_gguf(hf, tmp_path / "moe.gguf", "qwen3moe", "Q8_0", meta)
    prompts = tm.prompts(4, seed=7)
    params = SamplingParams(temperature=0, max_tokens=16)
    outs = []
    for fraction in (None, 0.25, 0.5):
        llm = LLM(str(path), device="cuda:0", max_model_len=256, moe_offload=fraction)
        outs.append([r.token_ids for r in llm.generate(prompts, params)])
        del llm
    assert outs[1] == outs[0] and outs[2] == outs[0]
