"""AWQ (AutoAWQ `quant_method: awq`, `version: gemm`, 4 bits, zero points): `qweight` int32
(K, N/8) and `qzeros` int32 (K/g, N/8) packed along N in AWQ's order (bits 4i of a word hold
column ORDER[i]), `scales` fp16 (K/g, N); W = (q - z) * s. Converted at load into the int4
layout of `quant/int4.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from xinfer.errors import UserError
from xinfer.quant.checks import cdiv, expect, float_scale
from xinfer.quant.config import ModuleMatcher, QuantConfig
from xinfer.quant.int4 import Int4Grouped
from xinfer.quant.packing import codes_to_int32, int32_to_codes, pack_nibbles

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True, repr=False)
class AwqInt4(Int4Grouped):
    producer: str = "awq"

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("qweight", "qzeros", "scales")

    def convert(self, name: str, tensor: torch.Tensor, n: int, k: int) -> dict[str, torch.Tensor]:
        groups = cdiv(k, self.group(k))
        if name == "qweight":
            expect(self.name, name, tensor, (k, n // 8), (torch.int32,))
            codes = int32_to_codes(tensor, AWQ_ORDER).t()  # (N, K)
            return {"qweight": pack_nibbles(codes.contiguous())}
        if name == "scales":
            s = float_scale(self.name, name, tensor, (groups, n), self.scale_dtype)
            return {"scales": s.t().contiguous()}
        expect(self.name, name, tensor, (groups, n // 8), (torch.int32,))  # qzeros
        return {"zeros": int32_to_codes(tensor, AWQ_ORDER).t().contiguous()}

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """Round-to-nearest into AutoAWQ's gemm layout."""
        codes, scale, zero = self.quantize_codes(weight)
        return {
            "qweight": codes_to_int32(codes.t().contiguous(), AWQ_ORDER),  # (K, N/8)
            "qzeros": codes_to_int32(zero.t().contiguous(), AWQ_ORDER),  # (K/g, N/8)
            "scales": scale.to(self.scale_dtype).t().contiguous(),  # (K/g, N)
        }


def parse_config(qc: dict[str, Any], hf: dict[str, Any], act_dtype: torch.dtype) -> QuantConfig:
    bits = int(qc.get("bits", qc.get("w_bit", 4)))
    if bits != 4:
        raise UserError(f"AWQ with {bits} bits is not supported (4 bits only)")
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise UserError(f"AWQ version {version!r} is not supported (gemm only)")
    if not qc.get("zero_point", True):
        raise UserError("AWQ checkpoints without zero points are not supported")
    group = int(qc.get("group_size", qc.get("q_group_size", 128)))
    if group not in (32, 64, 128):
        raise UserError(f"AWQ group_size {group} is not supported (32, 64 or 128)")
    fmt = AwqInt4(group_size=group, has_zero=True, scale_dtype=torch.float16)
    ignore = ModuleMatcher(tuple(qc.get("modules_to_not_convert") or ()), "substring")
    return QuantConfig("awq", fmt, ignore)
