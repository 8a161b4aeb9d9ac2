"""GGUF files written with the `gguf` package's writer from tiny transformers models, run by
xinfer and by transformers loading the same file (`gguf_file=`): greedy tokens and logits
agree (MoE qwen3moe in Q8_0, and in Q4_K with Q6_K down experts, Q6_K v (a mixed merge,
kept as Q4_K | Q6_K segments) and a Q4_K LM head; dense llama with its permuted q/k, qwen2
with its q|k|v biases on such segments, qwen3, gemma3 with 1 + w norms). The engine keeps
the quantized weights in their blocks (GGUF formats; a Q4_K_M mix's q|k|v as segments,
with the tokens of the dequantized merge and the smaller size in the memory plan), and a
MoE file gives the same bytes at every offload fraction while moving the stored bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import dense_models as dm
import gguf_files as gf
import numpy as np
import pytest
import tiny_models as tm
import torch

from xinfer import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import write_q4km_gguf as q4km  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=16)
MOE_META = dict(expert_count=8, expert_used_count=2, expert_feed_forward_length=32)
K_META = dict(expert_count=4, expert_used_count=2, expert_feed_forward_length=256)
K_TYPES = {"ffn_down_exps": "Q6_K", "attn_v": "Q6_K"}


def _k_quant_moe():
    return tm.make_hf_model(
        "qwen3_moe", mlp_only_layers=[], hidden_size=256, moe_intermediate_size=256, head_dim=64,
        num_experts=4, num_hidden_layers=2, tie_word_embeddings=False, initializer_range=0.05,
    )  # fmt: skip


# (id, GGUF arch, maker, GGUF block type of the matrices, extra metadata, per-tensor types)
CASES = [
    ("qwen3moe-q8_0", "qwen3moe", lambda: tm.make_hf_model("qwen3_moe", mlp_only_layers=[]),
     "Q8_0", MOE_META),
    ("qwen3moe-q4_k", "qwen3moe", _k_quant_moe, "Q4_K", K_META, K_TYPES),
    ("llama-q4_0", "llama", lambda: dm.make_dense("llama"), "Q4_0", {}),
    # qwen2's q|k|v biases on a mixed merge kept as segments (Q4_K q|k, Q6_K v)
    ("qwen2-q4_k-q6_k-v", "qwen2", lambda: dm.make_dense("qwen2", hidden_size=256,
     intermediate_size=256), "Q4_K", {}, {"attn_v": "Q6_K"}),
    ("qwen3-q5_0", "qwen3", lambda: dm.make_dense("qwen3"), "Q5_0", {}),
    ("gemma3-bf16", "gemma3", lambda: dm.make_dense("gemma3_text", final_logit_softcapping=None),
     "BF16", {"sliding_window": 8}),
]  # fmt: skip


def _transformers_on_file(hf, path):
    from transformers import AutoModelForCausalLM

    # config given: transformers' GGUF config mapping lacks some keys (expert sizes)
    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, config=hf.config, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request, tmp_path_factory):
    _, arch, make, qtype, meta, *types = request.param
    hf = make()
    path = tmp_path_factory.mktemp(arch) / f"{arch}.gguf"
    gf.write_gguf(hf, path, arch, qtype, meta, types[0] if types else None)
    return path, _transformers_on_file(hf, path)


def test_gguf_matches_transformers_on_the_same_file(case):
    path, ref = case
    llm = LLM(str(path), device="cpu", dtype="float32")
    prompts = tm.prompts(3, seed=1)
    for prompt, result in zip(prompts, llm.generate(prompts, GREEDY)):
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
        assert result.token_ids == want[0, len(prompt) :].tolist()
    prompt = tm.prompts(4, seed=2)[3]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=5))[0]
    with torch.no_grad():
        logp = torch.log_softmax(ref(torch.tensor([prompt])).logits[0, -1].float(), -1)
    top = out.logprobs[0]
    for token_id, value in zip(top.top_ids, top.top_logprobs):
        assert abs(value - logp[token_id].item()) < 1e-4


def _formats(llm) -> dict[str, str]:
    model = llm.engine.model
    out = {
        name: m.weight_format.name
        for name, m in model.named_modules()
        if hasattr(m, "weight_names") and m.weight_format is not None
    }
    for i, moe in enumerate(model.moe_layers()):
        ew = moe.expert_weights
        out[f"experts.{i}"] = f"{ew.proj_fmt('w13').name}+{ew.proj_fmt('w2').name}"
    return out  # fmt: skip


def test_gguf_layers_keep_the_file_blocks(tmp_path):
    """Quantized linear and expert weights stay in their block types (down experts in
    theirs), a merge of mixed types (Q4_K q/k + Q6_K v) in its segments; the router runs
    dequantized."""
    path = gf.write_gguf(_k_quant_moe(), tmp_path / "k.gguf", "qwen3moe", "Q4_K", K_META, K_TYPES)
    formats = _formats(LLM(str(path), device="cpu", dtype="float32"))
    assert formats["experts.0"] == "gguf-q4_k+gguf-q6_k"
    assert formats["model.layers.0.self_attn.o_proj"] == "gguf-q4_k"
    assert formats["model.layers.0.self_attn.qkv_proj"] == "gguf-q4_k|q6_k"
    assert formats["model.layers.0.mlp.gate"] == "float32"
    assert formats["lm_head"] == "gguf-q4_k"


def _q4km_types(num_layers: int) -> dict[str, str]:
    """`write_q4km_gguf`'s Q4_K_M mix for the tensors a tiny qwen3moe file quantizes: Q6_K
    attn_v and down experts in the `use_more_bits` layers, a Q6_K head, the rest Q4_K."""
    names = [f"blk.{i}.{t}.weight" for i in range(num_layers) for t in ("attn_v", "ffn_down_exps")]
    types = {n: q4km.q4km_type(n, "q4_k", num_layers).upper() for n in names + ["output.weight"]}
    return {n.removesuffix("weight"): t for n, t in types.items() if t != "Q4_K"}


def test_q4km_mix_keeps_the_mixed_qkv_in_its_blocks(tmp_path, monkeypatch):
    """A Q4_K_M mix (layer 1 of 2 has more bits: Q6_K v beside Q4_K q/k): that layer's qkv
    takes the Q4_K | Q6_K segments (each its blocks as the file stores them), layer 0's
    stays one Q4_K weight; greedy tokens equal the dequantized merge's (segments off:
    MAX_SEGMENTS 1, what the engine did before), and the memory plan holds the segments'
    bytes, not the float32 weight's."""
    from xinfer.quant import gguf_segments

    types = _q4km_types(2)
    assert set(types) == {"blk.1.attn_v.", "blk.1.ffn_down_exps.", "output."}
    hf = _k_quant_moe()
    path = gf.write_gguf(hf, tmp_path / "q4km.gguf", "qwen3moe", "Q4_K", K_META, types)
    prompts, params = tm.prompts(3, seed=7), SamplingParams(temperature=0, max_tokens=12)
    llm = LLM(str(path), device="cpu", dtype="float32")
    formats = _formats(llm)
    assert formats["model.layers.0.self_attn.qkv_proj"] == "gguf-q4_k"
    assert formats["model.layers.1.self_attn.qkv_proj"] == "gguf-q4_k|q6_k"
    qkv = llm.engine.model.get_submodule("model.layers.1.self_attn.qkv_proj")
    cfg, k = hf.config, hf.config.hidden_size
    qk_rows = (cfg.num_attention_heads + cfg.num_key_value_heads) * cfg.head_dim
    v_rows = cfg.num_key_value_heads * cfg.head_dim
    assert qkv.weight_format.segments == (("Q4_K", qk_rows), ("Q6_K", v_rows))
    assert qkv.weight0.shape == (qk_rows, k // 256 * 144) and qkv.weight0.dtype == torch.uint8
    assert qkv.weight1.shape == (v_rows, k // 256 * 210)
    tokens = [r.token_ids for r in llm.generate(prompts, params)]

    monkeypatch.setattr(gguf_segments, "MAX_SEGMENTS", 1)
    before = LLM(str(path), device="cpu", dtype="float32")
    assert _formats(before)["model.layers.1.self_attn.qkv_proj"] == "float32"
    assert [r.token_ids for r in before.generate(prompts, params)] == tokens
    saved = (qk_rows + v_rows) * k * 4 - qkv.weight0.numel() - qkv.weight1.numel()
    plans = before.engine.weight_plan, llm.engine.weight_plan
    assert plans[0].device_bytes - plans[1].device_bytes == saved


def test_gguf_moe_offload_is_byte_identical_across_fractions(tmp_path):
    """Q4_0 gate/up with Q8_0 down experts: every fraction gives the resident tokens, and a
    slot fill moves exactly one expert's stored bytes; at 1.0 the experts are resident."""
    hf = tm.make_hf_model("qwen3_moe", mlp_only_layers=[])
    types = {"ffn_down_exps": "Q8_0"}
    path = gf.write_gguf(hf, tmp_path / "moe.gguf", "qwen3moe", "Q4_0", MOE_META, types)
    hidden, inter = hf.config.hidden_size, hf.config.moe_intermediate_size
    stored = 2 * inter * hidden // 32 * 18 + hidden * inter // 32 * 34  # Q4_0 w13 + Q8_0 w2
    prompts = tm.prompts(4, seed=5)
    params = SamplingParams(temperature=0, max_tokens=12)
    base = [
        r.token_ids for r in LLM(str(path), device="cpu", dtype="float32").generate(prompts, params)
    ]
    for fraction in (0.25, 0.5, 1.0):
        llm = LLM(str(path), device="cpu", dtype="float32", moe_offload=fraction)
        assert llm.engine.offload_manager is not None
        assert [r.token_ids for r in llm.generate(prompts, params)] == base
        stats = llm.engine.offload_manager.stats()
        for layer in stats["layers"]:
            assert layer["bytes_copied"] == layer["misses"] * stored
            assert layer["staging_bytes"] == layer["staging_copies"] * 8 * stored
        if fraction < 1.0:
            assert stats["bytes_moved"] > 0
        else:  # every expert has a slot: the layers are resident, nothing moves per step
            assert stats["bytes_moved"] == 0


def _llama3_rope_factors(cfg) -> np.ndarray:
    """What llama.cpp's converter writes as `rope_freqs.weight` for llama3 RoPE scaling."""
    rp = cfg.rope_parameters
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    freqs = 1.0 / (rp["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    orig, factor = rp["original_max_position_embeddings"], rp["factor"]
    low, high = rp["low_freq_factor"], rp["high_freq_factor"]
    out = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama3_rope_factors_from_the_file(tmp_path):
    """A llama GGUF with `rope_freqs.weight` (llama3 scaling, as llama.cpp's converter writes
    it) runs with those factors: greedy tokens equal transformers' model with llama3 RoPE."""
    rope = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_position_embeddings=64)  # fmt: skip
    hf = dm.make_dense("llama", rope_parameters=rope)
    extra = {"rope_freqs.weight": _llama3_rope_factors(hf.config)}
    path = gf.write_gguf(hf, tmp_path / "l3.gguf", "llama", "Q8_0", extra=extra)
    llm = LLM(str(path), device="cpu", dtype="float32")
    assert llm.engine.model_config.rope.freq_factors  # read from the file, not ignored
    ref = _transformers_on_file(hf, path)  # the file's weights, llama3 RoPE from hf.config
    prompts = tm.prompts(3, seed=4)
    for prompt, result in zip(prompts, llm.generate(prompts, GREEDY)):
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
        assert result.token_ids == want[0, len(prompt) :].tolist()
