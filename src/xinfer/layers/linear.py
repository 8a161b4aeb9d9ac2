"""Linear layers, including the merged projections (q|k|v, gate|up) whose checkpoint parts
are loaded into row slices of one weight (`shard_offsets` says where each part goes).
Forward goes through `kernels.linear`: the Triton skinny GEMM for decode batches on the GPU,
F.linear everywhere else."""

from __future__ import annotations

import torch
from torch import nn

from xinfer import kernels


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output dim."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(parts.values()), bias)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in parts.items():
            self.shard_offsets[name] = (start, size)
            start += size
