"""In-situ quantization (`--isq q8_0|q4k|q6k|q4_0`): a bf16/fp16/fp32 checkpoint's routed
experts (and, with `--isq-dense`, its other linear weights; never routers or the LM head)
are quantized to a GGUF block type as the loader reads each checkpoint tensor, on the GPU
when the engine runs there, straight into the layers' uint8 block tensors: host memory
holds the quantized model plus one checkpoint tensor. They then run (and offload) as the
GGUF formats do. A K-quant of a row length that is not a multiple of 256 falls back, per
tensor, to the 32-block type llama.cpp uses there (Q4_K → Q5_0, Q6_K → Q8_0)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from xinfer.errors import UserError
from xinfer.quant.base import TensorSpec, WeightFormat
from xinfer.quant.config import ModuleMatcher, QuantConfig
from xinfer.quant.gguf_blocks import block_type
from xinfer.quant.gguf_formats import GGUFFormat

logger = logging.getLogger("xinfer")

# --isq value → GGUF block type
ISQ_TYPES = {"q8_0": "Q8_0", "q4k": "Q4_K", "q6k": "Q6_K", "q4_0": "Q4_0"}
# llama-quantize's choice for rows a super-block of 256 does not divide
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_0", "Q6_K": "Q8_0"}
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_told: set[tuple[str, int]] = set()
# experts only: every module outside `.experts.` keeps the checkpoint's float weights
_DENSE_MODULES = ModuleMatcher((r"re:^(?!.*\.experts\.)",))


def block_format_for(type_name: str, k: int) -> GGUFFormat:
    """The block type a row of `k` weights is stored in for `type_name` (its fallback when
    the block size does not divide k; said once per row length)."""
    chosen = type_name
    while k % block_type(chosen).block_size:
        if chosen not in _FALLBACK:
            raise UserError(
                f"--isq {type_name}: rows of {k} weights are not a multiple of "
                f"{block_type(chosen).block_size}; this model cannot be quantized to it"
            )
        chosen = _FALLBACK[chosen]
    if chosen != type_name and (type_name, k) not in _told:
        _told.add((type_name, k))
        logger.warning(
            "--isq: rows of %d weights are not a multiple of %d; those tensors use %s "
            "instead of %s",
            k,
            block_type(type_name).block_size,
            chosen,
            type_name,
        )
    return GGUFFormat(chosen)


@dataclass(frozen=True, repr=False)
class IsqFormat(WeightFormat):
    """A float checkpoint weight quantized at load to `type_name` (per row length: see
    `block_format_for`), on `device`."""

    type_name: str
    device: str = "cpu"

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"isq-{self.type_name.lower()}"

    def block_format(self, k: int) -> GGUFFormat:
        return block_format_for(self.type_name, k)

    def tensor_specs(self, n: int, k: int) -> dict[str, TensorSpec]:
        return self.block_format(k).tensor_specs(n, k)

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("weight",)

    def convert(self, name: str, tensor: torch.Tensor, n: int, k: int) -> dict[str, torch.Tensor]:
        if tensor.dtype not in _FLOATS or tuple(tensor.shape) != (n, k):
            raise UserError(
                f"--isq quantizes float weights; checkpoint tensor {name!r} is {tensor.dtype} "
                f"{tuple(tensor.shape)} where a ({n}, {k}) float weight was expected"
            )
        return self.block_format(k).quantize(tensor.to(self.device))

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.block_format(weight.shape[-1]).quantize(weight)

    def engine_tensors(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.quantize(weight)

    def dequantize(self, tensors: dict[str, torch.Tensor], n: int, k: int) -> torch.Tensor:
        return self.block_format(k).dequantize(tensors, n, k)

    def triton_linear(self, x, tensors, bias, n, k):
        return self.block_format(k).triton_linear(x, tensors, bias, n, k)

    def triton_moe(self, hidden, topk_ids, topk_weights, w13, w2, inter, max_ids=None):
        f13, f2 = self.block_format(hidden.shape[-1]), self.block_format(inter)
        return f13.triton_moe(
            hidden, topk_ids, topk_weights, w13, w2, inter, w2_fmt=f2, max_ids=max_ids
        )

    def moe_merge_key(self, num_pairs, hidden):
        # w2's block type may differ (`block_format_for`); every GGUF type gives the same key
        return self.block_format(hidden.shape[-1]).moe_merge_key(num_pairs, hidden)


def isq_config(isq: str, include_dense: bool, device: torch.device | str) -> QuantConfig:
    """The QuantConfig of `--isq` (experts only unless `include_dense`)."""
    if isq not in ISQ_TYPES:
        raise UserError(f"--isq {isq!r} is not one of {', '.join(ISQ_TYPES)}")
    dev = torch.device(device)
    where = dev if dev.type == "cuda" else torch.device("cpu")
    fmt = IsqFormat(ISQ_TYPES[isq], str(where))
    ignore = ModuleMatcher() if include_dense else _DENSE_MODULES
    return QuantConfig(f"isq {isq}", fmt, ignore)
