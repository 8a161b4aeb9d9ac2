"""`--isq`: a float checkpoint's experts quantized at load to GGUF blocks. On a tiny qwen2_moe
(shared expert, expert rows of 96: the K-quants fall back to Q5_0 / Q8_0 for w2, said
once), the log-probabilities of the reference's top tokens stay within a stated tolerance
of the unquantized model's; the experts are stored as uint8 blocks (only the dense weights
too with --isq-dense; never routers or the LM head); offload moves the quantized bytes and
gives the same tokens at every fraction; quantized checkpoints are refused."""

from __future__ import annotations

import logging

import gguf_files as gf
import pytest
import tiny_models as tm

from xinfer import LLM, SamplingParams
from xinfer.errors import UserError

# max |log p(token) - log p_ref(token)| over the reference's 10 likeliest next tokens (measured:
# 0.005 for q8_0, 0.045 for q4k on this model)
TOLERANCE = {"q8_0": 0.02, "q4k": 0.15}
HIDDEN, INTER, EXPERTS = 256, 96, 4
TOP = SamplingParams(temperature=0, max_tokens=1, logprobs=20)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    hf = tm.make_hf_model(
        "qwen2_moe", hidden_size=HIDDEN, moe_intermediate_size=INTER, num_experts=EXPERTS,
        shared_expert_intermediate_size=128, intermediate_size=128, num_hidden_layers=2,
        initializer_range=0.05,
    )  # fmt: skip
    return tm.write_checkpoint(hf, tmp_path_factory.mktemp("isq"))


@pytest.fixture(scope="module")
def reference(ckpt):
    prompts = tm.prompts(3, seed=1)
    return prompts, LLM(str(ckpt), device="cpu", dtype="float32").generate(prompts, TOP)


@pytest.mark.parametrize("isq", sorted(TOLERANCE))
def test_isq_logprobs_within_tolerance(ckpt, reference, isq, caplog) -> None:
    prompts, ref = reference
    with caplog.at_level(logging.WARNING, logger="xinfer"):
        llm = LLM(str(ckpt), device="cpu", dtype="float32", isq=isq)
    fallbacks = [r for r in caplog.records if "not a multiple of" in r.getMessage()]
    assert len(fallbacks) == (1 if isq == "q4k" else 0)  # w2 rows of 96: Q5_0, said once
    for got, want in zip(llm.generate(prompts, TOP), ref):
        ours = dict(zip(got.logprobs[0].top_ids, got.logprobs[0].top_logprobs))
        top = want.logprobs[0]
        pairs = [(ours.get(t), v) for t, v in zip(top.top_ids, top.top_logprobs)]
        assert got.token_ids == want.token_ids
        assert all(o is not None and abs(o - v) < TOLERANCE[isq] for o, v in pairs[:10])


def _expert_row_bytes(llm) -> tuple[int, int]:
    moe = llm.engine.model.moe_layers()[0]
    return moe.expert_tensors["w13"].shape[-1], moe.expert_tensors["w2"].shape[-1]


def test_isq_stores_blocks_experts_only_unless_dense(ckpt) -> None:
    llm = LLM(str(ckpt), device="cpu", dtype="float32", isq="q4k")
    # Q4_K rows of 256 (144 bytes); Q5_0 rows of 96 (3 blocks of 22 bytes)
    assert _expert_row_bytes(llm) == (144, 66)
    layer = llm.engine.model.model.layers[0]
    assert layer.self_attn.qkv_proj.weight_format.name == "float32"
    dense = LLM(str(ckpt), device="cpu", dtype="float32", isq="q8_0", isq_dense=True)
    dense_layer, moe_layer = dense.engine.model.model.layers  # decoder_sparse_step 2
    assert dense_layer.self_attn.qkv_proj.weight_format.name == "isq-q8_0"
    assert dense_layer.mlp.gate_up_proj.weight_format.name == "isq-q8_0"
    assert moe_layer.mlp.shared_expert.gate_up_proj.weight_format.name == "isq-q8_0"
    assert moe_layer.mlp.gate.weight_format.name == "float32"  # the router
    assert dense.engine.model.lm_head.weight_format.name == "float32"


def test_isq_offload_moves_quantized_bytes_identically(ckpt) -> None:
    prompts = tm.prompts(4, seed=3)
    params = SamplingParams(temperature=0, max_tokens=10)
    base = LLM(str(ckpt), device="cpu", dtype="float32", isq="q8_0")
    want = [r.token_ids for r in base.generate(prompts, params)]
    w13, w2 = _expert_row_bytes(base)
    stored = 2 * INTER * w13 + HIDDEN * w2
    assert stored == 2 * INTER * HIDDEN // 32 * 34 + HIDDEN * INTER // 32 * 34
    for fraction in (0.5, 1.0):
        llm = LLM(str(ckpt), device="cpu", dtype="float32", isq="q8_0", moe_offload=fraction)
        assert [r.token_ids for r in llm.generate(prompts, params)] == want
        for layer in llm.engine.offload_manager.stats()["layers"]:
            assert layer["bytes_copied"] == layer["misses"] * stored
            assert layer["staging_bytes"] == layer["staging_copies"] * EXPERTS * stored


def test_isq_refuses_quantized_checkpoints_and_lone_dense_flag(tmp_path) -> None:
    hf = tm.make_hf_model("qwen3_moe", mlp_only_layers=[])
    meta = dict(expert_count=8, expert_used_count=2, expert_feed_forward_length=32)
    path = gf.write_gguf(hf, tmp_path / "m.gguf", "qwen3moe", "Q8_0", meta)
    with pytest.raises(UserError, match="already stored as gguf"):
        LLM(str(path), device="cpu", dtype="float32", isq="q4_0")
    with pytest.raises(UserError, match="--isq-dense needs --isq"):
        LLM(str(path), device="cpu", dtype="float32", isq_dense=True)
