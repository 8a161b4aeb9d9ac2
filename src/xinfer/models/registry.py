"""Maps HF `architectures[0]` to the model file (one per `model_type`) that owns it. The
file is imported lazily and provides `config_from_hf(hf) -> ModelConfig` (its config
normalisation) and the model class (its layers, checkpoint renames and skipped tensors);
adding an architecture adds a file and one line here, never a branch in shared code."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from xinfer.errors import UserError

if TYPE_CHECKING:
    from xinfer.config import ModelConfig

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
    "Qwen3NextForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
    # the text model of the multimodal checkpoint (the vision tower is skipped)
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
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


def model_module(architecture: str) -> ModuleType:
    return importlib.import_module(f"xinfer.models.{_MODELS[architecture][0]}")


def get_model_class(architecture: str) -> type:
    return getattr(model_module(architecture), _MODELS[architecture][1])


def config_from_hf(hf_config: dict[str, Any]) -> ModelConfig:
    """The `ModelConfig` of an HF config dict, normalised by its architecture's model file."""
    architecture = resolve_architecture(hf_config)
    return model_module(architecture).config_from_hf(hf_config, architecture)
