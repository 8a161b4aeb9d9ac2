"""The decoder as a layer-by-layer driver sees it (runner/prompt_pass.py runs a long prompt
one layer at a time across all its chunks). A model that offers `layer_stack()` returns one;
everything runs under a forward context, as in the model's own `forward`:

    hidden = embed(input_ids)                                   # (T, H)
    hidden, residual = layer(positions, hidden, residual)       # residual None before layer 0
    hidden, residual = final_norm(hidden, residual)

The contract is that chaining these over one chunk equals `model(input_ids, positions)`
bit for bit; a layer may keep per-request state (KV cache, recurrent state) through the
forward context, so the driver runs a layer's chunks in order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

Residual = torch.Tensor | None


@dataclass(frozen=True)
class LayerStack:
    embed: Callable[[torch.Tensor], torch.Tensor]
    layers: Sequence[nn.Module]  # each: (positions, hidden, residual) → (hidden, residual)
    final_norm: Callable[[torch.Tensor, Residual], tuple[torch.Tensor, torch.Tensor]]
