"""A merged linear whose parts a GGUF file stores in different block types (a Q4_K_M file's
q|k in Q4_K and v in Q6_K in half the layers), kept in its blocks: its segments, the maximal
runs of one block type in part order, each its own engine tensor `weight{i}` uint8 (rows,
K / block_size * type_size) as the file stores those rows. The loader fills a part's rows
of its segment (`part_views`); the twin is the segments' dequantized rows stacked; the
kernels are `kernels/gguf_segments_launch.py`'s (one launch at decode)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

import torch

from xinfer.errors import UserError
from xinfer.quant.base import TensorSpec, WeightFormat
from xinfer.quant.gguf_blocks import BlockType, block_type, dequantize
from xinfer.quant.gguf_formats import QUANTIZED_TYPES, GGUFFormat
from xinfer.quant.gguf_quantize import quantize

# merges of at most this many segments keep their blocks (`weights/gguf_plan.py`); more run
# dequantized: their decode would take a launch a segment, slower than the bf16 linear
MAX_SEGMENTS = 2


def runs(types: Sequence[str]) -> list[tuple[str, int]]:
    """(type, number of parts) of each maximal run of one block type, in part order."""
    return [(t, len(list(run))) for t, run in groupby(types)]


@dataclass(frozen=True, repr=False)
class GGUFSegmentsFormat(WeightFormat):
    """`segments`: (GGUF block type, rows) of each segment, top to bottom, e.g.
    (("Q4_K", 4608), ("Q6_K", 512)); adjacent segments differ in type."""

    segments: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        types = [t for t, _ in self.segments]
        if len(types) < 2 or any(a == b for a, b in zip(types, types[1:])):
            raise ValueError(f"GGUF segments need two or more runs of types: {self.segments}")
        bad = [t for t in types if t not in QUANTIZED_TYPES]
        if bad or any(rows <= 0 for _, rows in self.segments):
            raise ValueError(f"GGUF segments of quantized types and rows only: {self.segments}")

    @classmethod
    def from_parts(cls, parts: Sequence[tuple[str, int]]) -> GGUFSegmentsFormat:
        """The format of merged parts given as (block type, rows) in part order."""
        runs_of_parts = groupby(parts, key=lambda part: part[0])
        return cls(tuple((t, sum(rows for _, rows in run)) for t, run in runs_of_parts))

    @property
    def name(self) -> str:  # type: ignore[override]
        return "gguf-" + "|".join(t.lower() for t, _ in self.segments)

    @property
    def btypes(self) -> list[BlockType]:
        return [block_type(t) for t, _ in self.segments]

    @property
    def rows(self) -> list[int]:
        return [rows for _, rows in self.segments]

    def _check_n(self, n: int) -> None:
        if n != sum(self.rows):
            raise ValueError(f"{self.name}: a weight of {n} rows, its segments {self.segments}")

    def tensor_specs(self, n: int, k: int) -> dict[str, TensorSpec]:
        self._check_n(n)
        return {
            f"weight{i}": TensorSpec((rows, bt.row_bytes(k)), torch.uint8, 1, bt.block_size)
            for i, (bt, rows) in enumerate(zip(self.btypes, self.rows))
        }

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("weight",)

    def part_views(self, tensors, n, k, start, rows, what):
        """A part lies in one segment: its `GGUFFormat` and the segment's rows it fills."""
        self._check_n(n)
        first = 0
        for i, (t, seg_rows) in enumerate(self.segments):
            if first <= start and start + rows <= first + seg_rows:
                view = tensors[f"weight{i}"][start - first : start - first + rows]
                return GGUFFormat(t), {"weight": view}
            first += seg_rows
        raise UserError(f"{what} covers rows {start}..{start + rows}, across {self.name} segments")

    def convert(self, name: str, tensor: torch.Tensor, n: int, k: int) -> dict[str, torch.Tensor]:
        """`weight{i}`: segment i's whole blocks (what `quantize` gives). A checkpoint's parts
        are converted by their own `GGUFFormat` (`part_views`)."""
        index = name.removeprefix("weight")
        if not index.isdigit() or int(index) >= len(self.segments):
            raise UserError(f"checkpoint tensor {name!r} is not a segment of {self.name}")
        t, rows = self.segments[int(index)]
        return {name: GGUFFormat(t).convert(name, tensor, rows, k)["weight"]}

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        self._check_n(weight.shape[0])
        pieces = torch.split(weight, self.rows)
        types = [t for t, _ in self.segments]
        return {f"weight{i}": quantize(p, t) for i, (t, p) in enumerate(zip(types, pieces))}

    def dequantize(self, tensors: dict[str, torch.Tensor], n: int, k: int) -> torch.Tensor:
        self._check_n(n)
        return torch.cat(
            [dequantize(tensors[f"weight{i}"], bt, k) for i, bt in enumerate(self.btypes)]
        )

    def triton_linear(self, x, tensors, bias, n, k):
        from xinfer.kernels import gguf_segments_launch

        self._check_n(n)
        ws = [tensors[f"weight{i}"] for i in range(len(self.segments))]
        return gguf_segments_launch.linear(x, ws, self.btypes, self.rows, bias, k)

    def triton_moe(self, *args, **kwargs):
        raise TypeError(f"{self.name} is a linear's format: expert layers take one type each")
