"""The seed's headline command on a small scale: a tiny FP8 (block-scaled e4m3)
`qwen3_5_moe` checkpoint in the published layout — full attention, the linear layers'
`in_proj_qkv` / `in_proj_z` / `out_proj`, the shared expert and every routed expert
quantized; `in_proj_a` / `in_proj_b`, conv, norms, routers and the LM head in float, as
`modules_to_not_convert` says — runs with `XINFER_MOE_OFFLOAD=0.2`, token for token as
transformers on the same weights dequantized by the published formula, and as without
offload."""

from __future__ import annotations

import re

import quant_ckpt as qk
import tiny_models as tm
import torch

from xinfer import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
QUANTIZED = re.compile(r"\.((q|k|v|o|gate|up|down)_proj|in_proj_qkv|in_proj_z|out_proj)$")
IGNORED = ["lm_head", "in_proj_a", "in_proj_b", "conv1d", "mlp.gate", "shared_expert_gate"]


def test_fp8_qwen3_5_moe_with_offload_0_2(tmp_path, monkeypatch):
    hf, path = qk.write_quantized(
        "qwen3_5_moe", "fp8", tmp_path / "fp8", seed=3, quantized=QUANTIZED,
        qc_extra={"modules_to_not_convert": IGNORED}, num_experts=16,
        shared_expert_intermediate_size=128, intermediate_size=tm.DROP,
    )  # fmt: skip
    prompts = [p + p for p in tm.prompts(3, seed=6)]
    want = [
        hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False)[0, len(p) :].tolist()
        for p in prompts
    ]
    resident = LLM(str(path), device="cpu", dtype="float32")
    linear = resident.engine.model.model.layers[0].linear_attn
    assert linear.in_proj_qkvz.weight.dtype == torch.float8_e4m3fn
    assert linear.out_proj.weight.dtype == torch.float8_e4m3fn
    assert linear.in_proj_ba.weight.dtype == torch.float32
    assert [r.token_ids for r in resident.generate(prompts, GREEDY)] == want
    monkeypatch.setenv("XINFER_MOE_OFFLOAD", "0.2")
    offloaded = LLM(str(path), device="cpu", dtype="float32")
    assert [r.token_ids for r in offloaded.generate(prompts, GREEDY)] == want
    stats = offloaded.offload_stats()
    assert stats is not None and stats["calls"] + stats["staging_copies"] > 0
