"""Every quantized checkpoint format on CPU: a tiny checkpoint in the producer's layout
(written by our quantizer) gives the same greedy tokens as transformers running the same
weights dequantized by the published formula; offload fractions do not change a bit; the
loaded engine tensors dequantize to exactly those weights; mismatched checkpoints are
refused with one sentence."""

from __future__ import annotations

import re

import pytest
import quant_ckpt as qk
import tiny_models as tm
import torch
from safetensors.torch import load_file, save_file

from xinfer import LLM, SamplingParams
from xinfer.errors import UserError

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
CASES = [(kind, "qwen3_moe") for kind in qk.FORMATS] + [
    ("nvfp4", "qwen2_moe"),
    ("ct", "qwen2_moe"),
    ("gptq-actorder-asym-g32", "qwen2_moe"),  # a shared expert: its gate/up share an order
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def case(request, tmp_path_factory):
    kind, arch = request.param
    hf, path = qk.write_quantized(arch, kind, tmp_path_factory.mktemp(f"{kind}-{arch}"))
    return kind, hf, LLM(str(path), device="cpu", dtype="float32")


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


def test_greedy_matches_transformers_on_published_dequant(case):
    kind, hf, llm = case
    prompts = tm.prompts(3, seed=1)
    for prompt, result in zip(prompts, llm.generate(prompts, GREEDY)):
        assert result.token_ids == _hf_greedy(hf, prompt, GREEDY.max_tokens), kind


def test_loaded_tensors_dequantize_to_the_published_weights(case):
    """The engine's twin on the loaded tensors equals the published formula, bit for bit."""
    kind, hf, llm = case
    model, ref = llm.engine.model, hf.state_dict()
    attn = model.model.layers[0].self_attn.qkv_proj
    assert attn.weight_format.is_quantized, attn.weight_format
    w = attn.weight_format.dequantize(attn.weight_tensors(), attn.out_features, attn.in_features)
    p = "model.layers.0.self_attn."
    expected = torch.cat(
        [ref[p + "q_proj.weight"], ref[p + "k_proj.weight"], ref[p + "v_proj.weight"]]
    )
    assert torch.equal(w, expected)
    moe = model.moe_layers()[0]
    ew, e = moe.expert_weights, 3
    names = ew.fmt.tensor_specs(*ew.proj_nk("w2"))
    one = {n: moe.expert_tensors[("w2" if n == "weight" else f"w2_{n}")][e] for n in names}
    layer = next(
        i
        for i, la in enumerate(model.model.layers)
        if la.mlp.__class__.__name__ == "SparseMoeBlock"
    )
    down = ref[f"model.layers.{layer}.mlp.experts.down_proj"][e]
    assert torch.equal(ew.fmt.dequantize(one, *ew.proj_nk("w2")), down)


@pytest.mark.parametrize(
    "kind", ["fp8", "fp8-tensor", "fp8-ct-channel", "nvfp4", "ct-asym-g64", "gptq-actorder"]
)
def test_offload_fractions_are_byte_identical(kind, tmp_path):
    _, path = qk.write_quantized("qwen3_moe", kind, tmp_path / kind, seed=2, num_experts=16)
    prompts = tm.prompts(3, seed=4)
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    base = [r.token_ids for r in LLM(str(path), device="cpu").generate(prompts, greedy)]
    for fraction in (0.125, 0.5):
        llm = LLM(str(path), device="cpu", moe_offload=fraction)
        got = [r.token_ids for r in llm.generate(prompts, greedy)]
        assert got == base, f"{kind}: offload {fraction} changed the output"
        stats = llm.offload_stats()
        if fraction == 1.0:  # every expert fits: the layers run resident, nothing offloaded
            assert stats["offloaded_layers"] == 0 and stats["bytes_moved"] == 0
            continue
        assert stats["calls"] + stats["staging_copies"] > 0  # the experts went through offload
        if fraction == 0.5:  # 8 slots hold a 3-request decode step: lookup/fill ran
            assert stats["hits"] + stats["misses"] > 0


@pytest.mark.parametrize("kind", ["gptq", "nvfp4"])
def test_prefetch_on_quantized_experts_keeps_output(kind, tmp_path):
    """Cross-layer prefetch moves a format's whole tensor set (codes, scales) like a miss:
    the same tokens as no offload, one and two layers ahead, and the prefetches were made
    and used (the offload rows of 4-bit experts are where prefetch has the most to hide)."""
    _, path = qk.write_quantized(
        "qwen3_moe", kind, tmp_path / kind, seed=2, num_experts=16, num_hidden_layers=4
    )
    prompts = tm.prompts(3, seed=4)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    base = [r.token_ids for r in LLM(str(path), device="cpu").generate(prompts, greedy)]
    for fraction, distance in ((0.25, 1), (0.5, 2)):
        llm = LLM(str(path), device="cpu", moe_offload=fraction, moe_prefetch=distance)
        got = [r.token_ids for r in llm.generate(prompts, greedy)]
        assert got == base, f"{kind}: prefetch {distance} at {fraction} changed the output"
        stats = llm.offload_stats()
        pf = stats["prefetch"]
        assert pf["predicted"] == pf["present"] + pf["prefetched"] + pf["dropped"]
        assert pf["prefetched"] > 0 and pf["used"] > 0, pf
        expert_bytes = stats["bytes_copied"] // max(1, stats["misses"])
        assert pf["prefetched_bytes"] == pf["prefetched"] * expert_bytes


def test_ignore_list_keeps_modules_unquantized(tmp_path):
    """compressed-tensors `ignore` with a regex: layer 2's attention stays in float."""
    import json

    skip = re.compile(r"layers\.2\.self_attn")
    hf, path = qk.write_quantized("qwen3_moe", "ct", tmp_path / "ct", skip=skip)
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"]["ignore"].append("re:.*layers\\.2\\.self_attn\\..*")
    (path / "config.json").write_text(json.dumps(cfg))
    llm = LLM(str(path), device="cpu", dtype="float32")
    layers = llm.engine.model.model.layers
    assert not layers[2].self_attn.qkv_proj.weight_format.is_quantized
    assert layers[0].self_attn.qkv_proj.weight_format.is_quantized
    prompt = tm.prompts(1, seed=5)[0]
    assert llm.generate([prompt], GREEDY)[0].token_ids == _hf_greedy(hf, prompt, GREEDY.max_tokens)


def _edit(path, fn) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


L0, E = "model.layers.0.", "model.layers.0.mlp.experts."


def _act_order_g_idx(k: int, group: int, seed: int) -> torch.Tensor:
    """A valid act-order g_idx (each group `group` channels) in a random order."""
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // group).to(torch.int32)
    return g_idx


MISMATCHES = [
    (
        "fp8",
        lambda t: t.pop(L0 + "self_attn.k_proj.weight_scale_inv"),
        r"missing tensors \(of the fp8-block-64x64 format\): model\.layers\.0\.self_attn",
    ),
    (
        "fp8",
        lambda t: t.update({L0 + "self_attn.o_proj.weight_scale_inv": torch.ones(3, 3)}),
        r"'model\.layers\.0\.self_attn\.o_proj\.weight_scale_inv' is float32 \(3, 3\), but "
        r"the declared fp8-block-64x64 format stores it as float32/bfloat16/float16 \(2, 2\)",
    ),
    (
        "nvfp4",
        lambda t: t.update({E + "1.up_proj.weight": torch.zeros(128, 128, dtype=torch.bfloat16)}),
        r"is bfloat16 \(128, 128\), but the declared nvfp4 format stores it as uint8 \(128, 64\)",
    ),
    (
        "gptq",
        lambda t: t.pop("model.layers.2.mlp.experts.5.down_proj.qzeros"),
        r"missing tensors \(of the gptq-int4-g128-sym format\): "
        r"model\.layers\.2\.mlp\.experts\.w2\.qzeros",
    ),
    (
        "gptq",
        lambda t: t.update({L0 + "self_attn.q_proj.g_idx": torch.randperm(128).to(torch.int32)}),
        r"act-order g_idx but its quantization_config says desc_act: false",
    ),
    (  # groups of 31 and 33 channels: the sorted layout's one scale per 32 cannot hold them
        "gptq-actorder-asym-g32",
        lambda t: t[L0 + "self_attn.o_proj.g_idx"].copy_(
            (torch.arange(128) + 1).clamp(max=127) // 32
        ),
        r"GPTQ g_idx puts 31 input channels in scale group 0 where group_size is 32",
    ),
    (
        "gptq-actorder-asym-g32",
        lambda t: t.update({L0 + "self_attn.k_proj.g_idx": _act_order_g_idx(128, 32, seed=9)}),
        r"'model\.layers\.0\.self_attn\.[qkv]_proj\.g_idx' differs from the g_idx of the "
        r"projections merged with it into model\.layers\.0\.self_attn\.qkv_proj",
    ),
    (
        "gptq-actorder-asym-g32",
        lambda t: t.update({E + "2.up_proj.g_idx": _act_order_g_idx(128, 32, seed=9)}),
        r"'model\.layers\.0\.mlp\.experts\.2\.(gate|up)_proj\.g_idx' differs from the g_idx of "
        r"the projections merged with it into model\.layers\.0\.mlp\.experts\.w13 of expert 2",
    ),
    (
        "awq",
        lambda t: t.update({L0 + "self_attn.q_proj.weight": torch.zeros(128, 128)}),
        r"tensors this model does not use \(of the awq-int4-g64-asym format\): "
        r"model\.layers\.0\.self_attn\.q_proj\.weight",
    ),
]


@pytest.mark.parametrize("kind,edit,message", MISMATCHES, ids=range(len(MISMATCHES)))
def test_mismatched_checkpoints_are_refused(kind, edit, message, tmp_path):
    _, path = qk.write_quantized("qwen3_moe", kind, tmp_path / kind)
    _edit(path, edit)
    with pytest.raises(UserError, match=message):
        LLM(str(path), device="cpu", dtype="float32")


def test_act_order_under_tensor_parallelism_is_refused_before_loading(tmp_path):
    """A rank's K share would cut through act-order's scale groups: the format says so and
    the loader refuses in one sentence before any weight is allocated or read."""
    from xinfer.config import ModelConfig
    from xinfer.parallel import group
    from xinfer.runner.model_loader import quant_config

    _, path = qk.write_quantized("qwen3_moe", "gptq-actorder", tmp_path / "ao", reference=False)
    cfg = ModelConfig.from_dir(path)
    assert quant_config(path, cfg, torch.float32).fmt.name.startswith("gptq")  # one device
    previous = group.current_group()
    group.set_current_group(object())  # any group: a tensor-parallel rank
    try:
        with pytest.raises(UserError, match=r"cannot be split for tensor parallelism yet"):
            quant_config(path, cfg, torch.float32)
    finally:
        group.set_current_group(previous)


@pytest.mark.parametrize(
    "kind,change,message",
    [
        ("gptq", {"bits": 8}, r"GPTQ with 8 bits is not supported"),
        ("awq", {"version": "gemv"}, r"AWQ version 'gemv' is not supported"),
        ("fp8", {"weight_block_size": [64]}, r"weight_block_size must be two positive"),
        ("ct", {"format": "marlin-24"}, r"format 'marlin-24' is not supported"),
    ],
)
def test_unsupported_options_are_refused_before_loading(kind, change, message, tmp_path):
    import json

    _, path = qk.write_quantized("qwen3_moe", kind, tmp_path / kind)
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"].update(change)
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=message):
        LLM(str(path), device="cpu", dtype="float32")


@pytest.mark.parametrize("kind", ["fp8", "nvfp4", "awq"])
def test_dummy_weights_are_valid_in_the_declared_format(kind, tmp_path):
    """`--load-format dummy` quantizes random weights with the format's own quantizer: the
    layers hold that format, the model generates, and offload moves the stored bytes
    (bytes per miss = the format's bytes per expert) without changing the output."""
    _, path = qk.write_quantized("qwen3_moe", kind, tmp_path / kind, reference=False)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    kw = dict(device="cpu", dtype="float32", load_format="dummy")
    llm = LLM(str(path), **kw)
    moe = llm.engine.model.moe_layers()[0]
    assert moe.weight_format.is_quantized and moe.weight_format.name.startswith(kind[:2])
    base = [r.token_ids for r in llm.generate(tm.prompts(2), greedy)]
    off = LLM(str(path), moe_offload=0.5, **kw)
    assert [r.token_ids for r in off.generate(tm.prompts(2), greedy)] == base
    stats = off.offload_stats()
    per_miss = moe.expert_weights.expert_bytes
    assert per_miss < 3 * 128 * 128 * 4 / 3  # well under the fp32 expert's bytes
    assert stats["bytes_copied"] == stats["misses"] * per_miss
