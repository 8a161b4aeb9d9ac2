"""`quant_method` → the module that parses its config (imported lazily). Adding a format is
adding a module and one line here; nothing else in the engine names formats."""

from __future__ import annotations

import importlib

from xinfer.errors import UserError

# quant_method (lower case) → (module under xinfer.quant, what we call it in messages)
_METHODS: dict[str, tuple[str, str]] = {
    "fp8": ("fp8", "fp8 (block scales)"),
    "modelopt": ("modelopt", "modelopt (nvfp4, fp8)"),
    "gptq": ("gptq", "gptq (4-bit)"),
    "awq": ("awq", "awq (4-bit gemm)"),
    "compressed-tensors": (
        "compressed_tensors",
        "compressed-tensors (pack-quantized w4a16, float-quantized fp8)",
    ),
    "gguf": ("gguf_formats", "GGUF block types (--m file.gguf)"),
}


def supported_methods() -> list[str]:
    return sorted({label for _, label in _METHODS.values()})


def parser_for(method: str):
    if method not in _METHODS:
        known = ", ".join(supported_methods()) or "none yet"
        raise UserError(
            f"quantization method {method!r} is not supported; xinfer reads unquantized "
            f"bf16/fp16/fp32 checkpoints and these quantized formats: {known}"
        )
    module_name, _ = _METHODS[method]
    return importlib.import_module(f"xinfer.quant.{module_name}").parse_config
