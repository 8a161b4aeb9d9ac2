"""Maps HF `architectures[0]` to the model class, imported lazily from one file per
`model_type`."""

from __future__ import annotations

import importlib
from typing import Any

from xinfer.errors import UserError

# architecture name → (module under xinfer.models, class name)
_MODELS: dict[str, tuple[str, str]] = {
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "OlmoeForCausalLM": ("olmoe", "OlmoeForCausalLM"),
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def resolve_architecture(hf_config: dict[str, Any]) -> str:
    archs = hf_config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in _MODELS:
        raise UserError(
            f"unsupported architecture {arch!r}; supported: {', '.join(supported_architectures())}"
        )
    return arch


def get_model_class(architecture: str) -> type:
    module_name, cls_name = _MODELS[architecture]
    module = importlib.import_module(f"xinfer.models.{module_name}")
    return getattr(module, cls_name)
