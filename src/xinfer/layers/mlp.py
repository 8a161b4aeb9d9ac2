"""Dense gated MLP (SiLU(gate) * up → down), used for dense layers and shared experts."""

from __future__ import annotations

import torch
from torch import nn

from xinfer import kernels
from xinfer.layers.linear import Linear, MergedLinear


class GatedMLP(nn.Module):
    # Tensor parallel: each rank holds a slice of the intermediate dim (parallel/plan.py).
    tp_plan = {"gate_up_proj": "column", "down_proj": "row"}
    tp_output = "partial"

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        parts = {"gate": intermediate_size, "up": intermediate_size}
        self.gate_up_proj = MergedLinear(hidden_size, parts)
        self.down_proj = Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(kernels.silu_and_mul(self.gate_up_proj(x)))
