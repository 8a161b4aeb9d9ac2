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


def _k_quant_moe_file(tmp_path):
    hf = tm.make_hf_model(
        "qwen3_moe", mlp_only_layers=[], hidden_size=256, moe_intermediate_size=256,
        head_dim=64, tie_word_embeddings=False, initializer_range=0.05,
    )  # fmt: skip
    meta = dict(expert_count=8, expert_used_count=2, expert_feed_forward_length=256)
    types = {"ffn_down_exps": "Q6_K"}
    return gf.write_gguf(hf, tmp_path / "k.gguf", "qwen3moe", "Q4_K", meta, types)


def test_raw_gguf_experts_offload_graph_eager_resident_agree(tmp_path):
    """Q4_K gate/up and Q6_K down experts kept in their blocks on the GPU: CUDA-graph decode
    at 0.25 / 0.5 / 1.0 and eager decode give the resident graph's tokens, and a slot fill
    moves one expert's stored bytes."""
    from xinfer import LLM, SamplingParams

    path = _k_quant_moe_file(tmp_path)
    stored = 2 * 256 * 144 + 256 * 210  # Q4_K w13 rows + Q6_K w2 rows of 256
    prompts = tm.prompts(4, seed=8)
    params = SamplingParams(temperature=0, max_tokens=16)
    runs = [(None, False), (0.25, False), (0.5, False), (1.0, False), (0.25, True)]
    outs = []
    for fraction, eager in runs:
        llm = LLM(str(path), device="cuda:0", max_model_len=256, moe_offload=fraction,
                  enforce_eager=eager)  # fmt: skip
        moe = llm.engine.model.moe_layers()[0]
        assert moe.expert_weights.proj_fmt("w2").name == "gguf-q6_k"
        outs.append([r.token_ids for r in llm.generate(prompts, params)])
        if fraction is not None:
            for layer in llm.engine.offload_manager.stats()["layers"]:
                assert layer["bytes_copied"] == layer["misses"] * stored
        del llm
    assert all(o == outs[0] for o in outs[1:])


def test_isq_on_the_gpu_offloads_identically(tmp_path):
    """--isq q4k quantizes on the GPU (rows of 96 fall back to Q5_0); the offloaded engine's
    tokens equal the resident one's, in graphs."""
    from xinfer import LLM, SamplingParams

    hf = tm.make_hf_model(
        "qwen2_moe", hidden_size=256, moe_intermediate_size=96, num_experts=8,
        shared_expert_intermediate_size=128, intermediate_size=128, initializer_range=0.05,
    )  # fmt: skip
    path = tm.write_checkpoint(hf, tmp_path / "ckpt")
    prompts = tm.prompts(4, seed=9)
    params = SamplingParams(temperature=0, max_tokens=16)
    outs = []
    for fraction in (None, 0.25, 0.5):
        llm = LLM(str(path), device="cuda:0", max_model_len=256, isq="q4k", moe_offload=fraction)
        outs.append([r.token_ids for r in llm.generate(prompts, params)])
        del llm
    assert outs[1] == outs[0] and outs[2] == outs[0]
