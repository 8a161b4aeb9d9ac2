"""Linear layers, including the merged projections (q|k|v, gate|up) whose checkpoint parts
are loaded into row ranges of one weight (`shard_offsets` says where each part goes). The
weight is stored in a `WeightFormat` (plain float or quantized: its tensors are this module's
parameters); forward goes through `kernels.format_linear`, which runs the format's kernels on
the GPU and its twin elsewhere."""

from __future__ import annotations

import torch
from torch import nn

from xinfer import kernels
from xinfer.quant.assign import is_deferred
from xinfer.quant.base import WeightFormat
from xinfer.quant.unquantized import Unquantized
from xinfer.weights.mapping import checkpoint_part_name


class Linear(nn.Module):
    """`quantizable=False` keeps the weight unquantized whatever the checkpoint's format
    (routers, as the public checkpoints and vLLM do)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, quantizable: bool = True
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.is_quantizable = quantizable
        self.act_dtype = torch.get_default_dtype()
        self.weight_device = torch.get_default_device()
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.weight_format: WeightFormat | None = None
        self.weight_names: tuple[str, ...] = ()
        if not is_deferred():
            self.create_weights(Unquantized(self.act_dtype))

    def create_weights(self, fmt: WeightFormat) -> None:
        """(Re)create the weight's tensors in `fmt`, as parameters named after the format's
        tensors (uninitialised; the loader or dummy init fills them)."""
        for name in self.weight_names:
            delattr(self, name)
        specs = fmt.tensor_specs(self.out_features, self.in_features)
        for name, spec in specs.items():
            t = torch.empty(spec.shape, dtype=spec.dtype, device=self.weight_device)
            setattr(self, name, nn.Parameter(t, requires_grad=False))
        self.weight_format, self.weight_names = fmt, tuple(specs)

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.weight_names}

    def checkpoint_modules(self, name: str) -> list[str]:
        """Checkpoint module names this layer is loaded from."""
        return [name]

    def part_rows(self) -> list[int]:
        """Rows of each of `checkpoint_modules`, in order."""
        return [self.out_features]

    def plain_weight(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The (N, K) weight when it is a plain `dtype` tensor with no bias — what a kernel
        that folds this linear into its own work can read directly — else None."""
        fmt = self.weight_format
        plain = isinstance(fmt, Unquantized) and fmt.dtype == dtype and self.bias is None
        return self.weight if plain else None

    def row_range(self, part: str | None) -> tuple[int, int]:
        """(first row, rows) of a checkpoint part in the weight's N dim."""
        return 0, self.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.format_linear(
            x,
            self.weight_format,
            self.weight_tensors(),
            self.bias,
            self.out_features,
            self.in_features,
        )


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output dim."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(parts.values()), bias)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in parts.items():
            self.shard_offsets[name] = (start, size)
            start += size

    def checkpoint_modules(self, name: str) -> list[str]:
        return [checkpoint_part_name(name, part) for part in self.shard_offsets]

    def part_rows(self) -> list[int]:
        return [rows for _, rows in self.shard_offsets.values()]

    def row_range(self, part: str | None) -> tuple[int, int]:
        return (0, self.out_features) if part is None else self.shard_offsets[part]
