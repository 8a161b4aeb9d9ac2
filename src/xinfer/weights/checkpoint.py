"""Picks the checkpoint reader for a model path: a `.gguf` file (or split parts) or an HF
directory of safetensors. Both yield (HF checkpoint name, tensor) for `load_weights`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from xinfer.weights.gguf_file import is_gguf_path
from xinfer.weights.safetensors import iter_safetensors


def iter_checkpoint(
    path: str | Path,
    hf_config: dict[str, Any],
    show_progress: bool = True,
    device: torch.device | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """`device`: where GGUF blocks are dequantized (the GPU, when the model runs there)."""
    if is_gguf_path(path) and Path(path).is_file():
        from xinfer.weights.gguf_loader import iter_gguf

        return iter_gguf(path, hf_config, show_progress, device)
    return iter_safetensors(path, show_progress)
