"""Config normalisation lives in the model files: each registered architecture's module
builds its `ModelConfig` from the HF config dict, quirks included (per-head vs whole-projection
q/k norms, qkv bias defaults, Mixtral's expert width and renormalised top-k)."""

from __future__ import annotations

import pytest
import tiny_models as tm
import torch

from xinfer.config import ModelConfig
from xinfer.errors import UserError
from xinfer.models import registry


def _hf_dict(model_type: str) -> dict:
    cfg_cls, model_cls = tm.hf_classes(model_type)
    d = cfg_cls(**{**tm._COMMON, **tm.ARCHS[model_type]}).to_dict()
    d["architectures"] = [model_cls.__name__]
    return d


def test_every_registered_module_owns_its_normalisation():
    for arch in registry.supported_architectures():
        assert callable(registry.model_module(arch).config_from_hf), arch


@pytest.mark.parametrize(
    "model_type, quirks",
    [
        ("qwen3_moe", dict(qk_norm="head", qkv_bias=False, norm_topk_prob=True)),
        ("qwen2_moe", dict(qk_norm=None, qkv_bias=True, shared_expert_intermediate_size=48)),
        ("mixtral", dict(norm_topk_prob=True, moe_intermediate_size=32, num_experts=8)),
        ("olmoe", dict(qk_norm="full", moe_intermediate_size=32, norm_topk_prob=False)),
    ],
)
def test_quirks_per_model(model_type, quirks):
    cfg = ModelConfig.from_hf(_hf_dict(model_type))
    assert cfg.model_type == model_type
    for key, value in quirks.items():
        assert getattr(cfg, key) == value, key
    assert cfg.kv_layer_ids == list(range(cfg.num_layers))
    assert cfg.state_bytes_per_seq(torch.float32) == 0


def test_unsupported_and_incomplete_configs_are_user_errors():
    with pytest.raises(UserError, match="unsupported architecture"):
        ModelConfig.from_hf({"architectures": ["NopeForCausalLM"]})
    hf = _hf_dict("qwen3_moe")
    del hf["hidden_size"]
    with pytest.raises(UserError, match="lacks 'hidden_size'"):
        ModelConfig.from_hf(hf)
