"""Checkpoint loading: sharded safetensors with an index, and clear errors for missing,
unexpected and mis-shaped tensors; dummy weights need only config.json."""

from __future__ import annotations

import json

import pytest
import tiny_models as tm
import torch
from safetensors.torch import load_file, save_file

from xinfer import LLM, SamplingParams, UserError

GREEDY = SamplingParams(temperature=0, max_tokens=8)


@pytest.fixture(scope="module")
def hf_model():
    return tm.make_hf_model("mixtral")


def test_sharded_checkpoint_with_index(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    prompt = tm.prompts(1)[0]
    ours = LLM(str(tmp_path), device="cpu").generate([prompt], GREEDY)[0].token_ids
    ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
    assert ours == ref[0, len(prompt) :].tolist()


def _rewrite(path, edit) -> None:
    f = path / "model.safetensors"
    tensors = load_file(str(f))
    edit(tensors)
    save_file(tensors, str(f), metadata={"format": "pt"})


def test_missing_tensor_is_named(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path)
    _rewrite(tmp_path, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(UserError, match=r"missing tensors: model\.layers\.1\.self_attn\.qkv_proj"):
        LLM(str(tmp_path), device="cpu")


def test_missing_expert_is_reported(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path)
    _rewrite(tmp_path, lambda t: t.pop("model.layers.0.block_sparse_moe.experts.3.w2.weight"))
    with pytest.raises(UserError, match=r"experts\.w2 \(1 expert parts\)"):
        LLM(str(tmp_path), device="cpu")


def test_unexpected_tensor_is_named(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path)
    _rewrite(tmp_path, lambda t: t.update({"model.layers.0.foo.weight": torch.zeros(2)}))
    with pytest.raises(UserError, match=r"does not use: model\.layers\.0\.foo\.weight"):
        LLM(str(tmp_path), device="cpu")


def test_shape_mismatch_is_explained(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 48  # the experts in the file are 32 wide
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=r"has shape .* but the model expects"):
        LLM(str(tmp_path), device="cpu")


@pytest.mark.parametrize("damage", ["cut short", "header only", "not safetensors"])
def test_damaged_weights_file_is_one_sentence(hf_model, tmp_path, damage):
    """A download cut short, or a file that is no safetensors at all, crashed with
    safetensors' own error and a traceback."""
    hf_model.save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    damaged = {
        "cut short": data[: len(data) // 2],
        "header only": data[:5],
        "not safetensors": b"\x10" + bytes(7) + b"{not json}" * 2,
    }[damage]
    f.write_bytes(damaged)
    with pytest.raises(UserError, match=r"model\.safetensors' is not a complete safetensors file"):
        LLM(str(tmp_path), device="cpu")


@pytest.mark.parametrize(
    "text", ["{bad", "[1, 2]", '{"weight_map": 5}', '{"weight_map": {"a": 1}}', '{"metadata": {}}']
)
def test_damaged_index_is_one_sentence(hf_model, tmp_path, text):
    """An index without a weight_map loaded no shard and then named every tensor missing."""
    hf_model.save_pretrained(tmp_path, max_shard_size="20KB")
    (tmp_path / "model.safetensors.index.json").write_text(text)
    with pytest.raises(UserError, match=r"model\.safetensors\.index\.json is not a valid index"):
        LLM(str(tmp_path), device="cpu")


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda cfg: [cfg], "must hold a JSON object"),
        (lambda cfg: {**cfg, "num_hidden_layers": "two"}, "num_hidden_layers must be a positive"),
        (lambda cfg: {**cfg, "hidden_size": 0}, "hidden_size must be a positive integer, got 0"),
        (lambda cfg: {**cfg, "num_key_value_heads": 1.5}, "num_key_value_heads must be a pos"),
    ],
)
def test_damaged_config_is_one_sentence(hf_model, tmp_path, edit, needle):
    """A config.json that is no object, or whose sizes are no positive integers, crashed
    deep in the model's construction."""
    hf_model.config.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(edit(cfg)))
    with pytest.raises(UserError, match=needle):
        LLM(str(tmp_path), device="cpu", load_format="dummy")


def test_no_weights_needs_dummy(hf_model, tmp_path):
    hf_model.config.save_pretrained(tmp_path)
    with pytest.raises(UserError, match="--load-format dummy"):
        LLM(str(tmp_path), device="cpu")
    llm = LLM(str(tmp_path), device="cpu", load_format="dummy")
    out = llm.generate([tm.prompts(1)[0]], GREEDY)[0]
    assert len(out.token_ids) == 8


def test_weights_load_into_a_model_that_has_run(tmp_path):
    """The resident executor shares the layer's expert tensors, so weights can still be
    loaded after a forward (the bench loads transformers' weights after graph capture)."""
    from xinfer.weights.loader import load_weights

    hf = tm.make_hf_model("qwen3_moe")
    tm.write_checkpoint(hf, tmp_path)
    llm = LLM(str(tmp_path), device="cpu", load_format="dummy")
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2))
    load_weights(llm.engine.model, hf.state_dict().items())
    prompt = tm.prompts(1)[0]
    ours = llm.generate([prompt], GREEDY)[0].token_ids
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
    assert ours == ref[0, len(prompt) :].tolist()


def test_offloaded_experts_are_built_on_the_host_beside_a_device_model(hf_model, tmp_path):
    """The model is built inside `with torch.device(device)`; the experts it offloads must
    still be made on the host (meta stands in for the GPU: every other tensor is meta)."""
    from xinfer.config import ModelConfig
    from xinfer.runner.model_loader import _construct

    hf_model.save_pretrained(tmp_path)
    cfg = ModelConfig.from_dir(str(tmp_path))
    meta, cpu = torch.device("meta"), torch.device("cpu")
    model = _construct(cfg, meta, torch.float32, 64, cpu, None)
    experts = [t for layer in model.moe_layers() for t in layer.expert_tensors.values()]
    assert experts and all(t.device == cpu for t in experts)
    assert all(p.device == meta for p in model.parameters())
