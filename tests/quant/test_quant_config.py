"""A checkpoint that declares quantization is never loaded as if it were unquantized: an
unknown method, or tensors that do not match the declared format, are refused before any
token is generated, with one sentence naming the formats xinfer reads."""

from __future__ import annotations

import json

import pytest
import tiny_models as tm

from xinfer import LLM
from xinfer.errors import UserError
from xinfer.quant.config import ModuleMatcher


@pytest.fixture(scope="module")
def plain_ckpt(tmp_path_factory):
    hf = tm.make_hf_model("qwen3_moe")
    return tm.write_checkpoint(hf, tmp_path_factory.mktemp("plain"))


def _declare(path, quantization_config: dict) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = quantization_config
    (path / "config.json").write_text(json.dumps(cfg))


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_unknown_method_is_refused_naming_the_formats(plain_ckpt, tmp_path):
    path = _copy(plain_ckpt, tmp_path / "bnb")
    _declare(path, {"quant_method": "bitsandbytes", "load_in_4bit": True})
    with pytest.raises(UserError, match=r"'bitsandbytes' is not supported; xinfer reads"):
        LLM(str(path), device="cpu", dtype="float32")


def test_declared_fp8_with_float_tensors_is_refused(plain_ckpt, tmp_path):
    """Before formats existed, these tensors fit the model and it generated garbage."""
    path = _copy(plain_ckpt, tmp_path / "fp8")
    _declare(path, {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16]})
    with pytest.raises(UserError):
        LLM(str(path), device="cpu", dtype="float32")


def test_modelopt_side_file_is_read(plain_ckpt, tmp_path):
    path = _copy(plain_ckpt, tmp_path / "modelopt")
    side = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "INT2_MAGIC"}}
    (path / "hf_quant_config.json").write_text(json.dumps(side))
    with pytest.raises(UserError):
        LLM(str(path), device="cpu", dtype="float32")


@pytest.mark.parametrize(
    "style,pattern,name,hit",
    [
        ("exact", "lm_head", "lm_head", True),
        ("exact", "re:.*mlp\\.gate$", "model.layers.3.mlp.gate", True),
        ("exact", "re:.*mlp\\.gate$", "model.layers.3.mlp.gate_proj", False),
        ("glob", "model.layers.*.self_attn*", "model.layers.0.self_attn.q_proj", True),
        ("glob", "*mlp.gate", "model.layers.0.mlp.gate_proj", False),
        ("substring", "gate", "model.layers.0.mlp.gate", True),
        ("substring", "gate", "model.layers.0.mlp.gate_proj", False),
        ("substring", "self_attn", "model.layers.0.self_attn.o_proj", True),
    ],
)
def test_ignore_lists_match_the_producers_way(style, pattern, name, hit):
    assert ModuleMatcher((pattern,), style).matches(name) is hit


@pytest.mark.parametrize("actorder", [None, "weight", "static", "group", "dynamic"])
def test_compressed_tensors_actorder(actorder):
    """`weight` (alias `static`) keeps groups contiguous: the plain int4 format; `group`
    (alias `dynamic`) stores a weight_g_idx, which is refused with one sentence."""
    from xinfer.quant.compressed_tensors import parse_config

    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
               "group_size": 128, "actorder": actorder}  # fmt: skip
    qc = {"format": "pack-quantized", "config_groups": {"g": {"weights": weights}}}
    if actorder in ("group", "dynamic"):
        with pytest.raises(UserError, match=r"actorder: group \(a weight_g_idx\) are not"):
            parse_config(qc, {}, None)
        return
    assert parse_config(qc, {}, None).fmt.name == "ct-int4-g128-sym"
