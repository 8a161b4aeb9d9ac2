"""GGUF block types (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K) as weight formats: a weight (N, K) is
its blocks' bytes `weight` uint8 (N, K / block_size * type_size), exactly as the file stores
each row, so offload moves the stored bytes. The twin is `gguf_blocks`' dequantizer; the
kernels (`kernels/gguf_launch.py`) read the blocks and dequantize in registers. Float GGUF
tensors (F32/F16/BF16) are not formats of their own: they load into the plain format.
`GGUFQuantConfig` gives each layer of a GGUF model the block type its file stores."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from xinfer.errors import UserError
from xinfer.quant.base import TensorSpec, WeightFormat
from xinfer.quant.config import QuantConfig
from xinfer.quant.gguf_blocks import BlockType, block_type, dequantize
from xinfer.quant.gguf_quantize import quantizable_types, quantize

QUANTIZED_TYPES = tuple(quantizable_types())  # the block types with kernels


@dataclass(frozen=True, repr=False)
class GGUFFormat(WeightFormat):
    """One quantized GGUF block type, e.g. GGUFFormat("Q4_K")."""

    type_name: str

    def __post_init__(self) -> None:
        if self.type_name not in QUANTIZED_TYPES:
            raise ValueError(f"GGUF type {self.type_name!r} is not a quantized block type")

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"gguf-{self.type_name.lower()}"

    @property
    def btype(self) -> BlockType:
        return block_type(self.type_name)

    def tensor_specs(self, n: int, k: int) -> dict[str, TensorSpec]:
        # the last dim holds whole blocks: K can be cut at block_size columns
        bt = self.btype
        return {"weight": TensorSpec((n, bt.row_bytes(k)), torch.uint8, 1, bt.block_size)}

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("weight",)

    def convert(self, name: str, tensor: torch.Tensor, n: int, k: int) -> dict[str, torch.Tensor]:
        want = (n, self.btype.row_bytes(k))
        if tensor.dtype != torch.uint8 or tuple(tensor.shape) != want:
            raise UserError(
                f"checkpoint tensor {name!r} is {tensor.dtype} {tuple(tensor.shape)}, not the "
                f"{self.type_name} blocks of a ({n}, {k}) weight (uint8 {want})"
            )
        return {"weight": tensor}

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"weight": quantize(weight, self.type_name)}

    def dequantize(self, tensors: dict[str, torch.Tensor], n: int, k: int) -> torch.Tensor:
        return dequantize(tensors["weight"], self.btype, k)

    def triton_linear(self, x, tensors, bias, n, k):
        from xinfer.kernels import gguf_launch

        return gguf_launch.linear(x, tensors["weight"], self.btype, bias, n, k)

    def triton_moe(self, hidden, topk_ids, topk_weights, w13, w2, inter, w2_fmt=None, max_ids=None):
        from xinfer.kernels import gguf_launch

        down = w2_fmt or self
        if not isinstance(down, GGUFFormat):
            raise TypeError(f"a {self.name} expert layer cannot run w2 in {down.name}")
        return gguf_launch.fused_moe(
            hidden, topk_ids, topk_weights, w13["weight"], self.btype,
            w2["weight"], down.btype, inter, max_ids=max_ids,
        )  # fmt: skip

    def moe_merge_key(self, num_pairs, hidden):
        # prefill-sized calls dequantize (the bits of a weight depend on it alone) and run the
        # bf16 grouped GEMMs, whatever the block types of w13 and w2
        from xinfer.kernels import gguf_launch

        return gguf_launch.moe_merge_key(num_pairs, hidden)


@dataclass(frozen=True)
class GGUFQuantConfig(QuantConfig):
    """A GGUF file's formats: every linear and expert layer (the LM head too: the file stores
    it quantized) takes the block type of its tensors when the plan keeps them raw
    (`weights/gguf_plan.py`), a merged linear whose kept parts differ in type the segments of
    `quant/gguf_segments.py`, else the plain format. `fmt` is the most common block type."""

    raw_modules: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    def covers(self, module) -> bool:
        return True

    def format_for(self, checkpoint_modules, default, part_rows=None) -> WeightFormat:
        types = [self.raw_modules.get(name) for name in checkpoint_modules]
        if not types or None in types:
            return default
        if len(set(types)) == 1:
            return GGUFFormat(types[0])
        if part_rows is None or len(part_rows) != len(types):
            raise ValueError(f"GGUF parts of types {types} need the rows of each part")
        from xinfer.quant.gguf_segments import GGUFSegmentsFormat

        return GGUFSegmentsFormat.from_parts(list(zip(types, part_rows)))

    def renamed(self, renames: tuple[tuple[str, str], ...]) -> GGUFQuantConfig:
        from xinfer.weights.mapping import apply_renames

        raw = {apply_renames(m + ".", renames)[:-1]: t for m, t in self.raw_modules.items()}
        return replace(self, raw_modules=raw)


def parse_config(qc: dict[str, Any], hf: dict[str, Any], act_dtype: torch.dtype) -> QuantConfig:
    """`{"quant_method": "gguf", "path": file}`, which `weights/gguf_config.py` writes into
    the HF config of a GGUF file."""
    from xinfer.weights.gguf_loader import cached_gguf
    from xinfer.weights.gguf_plan import plan_gguf

    if "path" not in qc:
        raise UserError("quant_method 'gguf' is for .gguf files: pass the file itself with --m")
    plan = plan_gguf(cached_gguf(str(qc["path"])))
    counts = Counter(plan.raw_modules.values())
    fmt = GGUFFormat(counts.most_common(1)[0][0]) if counts else GGUFFormat("Q8_0")
    return GGUFQuantConfig("gguf", fmt, raw_modules=plan.raw_modules)
