"""GPTQ (AutoGPTQ / GPTQModel `quant_method: gptq`, 4 bits): `qweight` int32 (K/8, N) packed
along K, `qzeros` int32 (K/g, N/8) packed along N, `scales` fp16 (K/g, N), `g_idx` int32 (K).
The v1 checkpoint format stores zero - 1 (`checkpoint_format: gptq`); `gptq_v2` stores the
zero itself. Symmetric checkpoints carry the constant zero 8; act-order (`desc_act`) is
refused. Converted at load into the int4 layout of `quant/int4.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from xinfer.errors import UserError
from xinfer.quant.checks import cdiv, expect, float_scale
from xinfer.quant.config import ModuleMatcher, QuantConfig
from xinfer.quant.int4 import SYM_ZERO, Int4Grouped
from xinfer.quant.packing import codes_to_int32, int32_to_codes, pack_nibbles


@dataclass(frozen=True, repr=False)
class GptqInt4(Int4Grouped):
    zero_offset: int = 1  # v1: stored zero = zero - 1
    producer: str = "gptq"

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("qweight", "qzeros", "scales", "g_idx")

    def required_checkpoint_names(self) -> tuple[str, ...]:
        return ("qweight", "qzeros", "scales")

    def convert(self, name: str, tensor: torch.Tensor, n: int, k: int) -> dict[str, torch.Tensor]:
        groups = cdiv(k, self.group(k))
        if name == "qweight":
            expect(self.name, name, tensor, (k // 8, n), (torch.int32,))
            codes = int32_to_codes(tensor.t())  # (N, K)
            return {"qweight": pack_nibbles(codes)}
        if name == "scales":
            s = float_scale(self.name, name, tensor, (groups, n), self.scale_dtype)
            return {"scales": s.t().contiguous()}
        if name == "qzeros":
            expect(self.name, name, tensor, (groups, n // 8), (torch.int32,))
            zeros = (int32_to_codes(tensor).to(torch.int16) + self.zero_offset).t()  # (N, K/g)
            if self.has_zero:
                if zeros.min() < 0 or zeros.max() > 15:
                    raise UserError(f"GPTQ qzeros out of range in a {self.name} checkpoint")
                return {"zeros": zeros.to(torch.uint8).contiguous()}
            if not bool((zeros == SYM_ZERO).all()):
                raise UserError(
                    "GPTQ checkpoint declares sym: true but its qzeros are not the symmetric "
                    f"zero {SYM_ZERO}; is checkpoint_format (gptq / gptq_v2) right?"
                )
            return {}
        expect(self.name, name, tensor, (k,), (torch.int32, torch.int64))  # g_idx
        if not torch.equal(tensor.long().cpu(), torch.arange(k) // self.group(k)):
            raise UserError(
                "GPTQ checkpoint has an act-order g_idx (desc_act); xinfer reads GPTQ "
                "checkpoints quantized without desc_act only"
            )
        return {}

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """Round-to-nearest into AutoGPTQ's on-disk layout (v1 zero offset applied)."""
        n, k = weight.shape
        codes, scale, zero = self.quantize_codes(weight)
        stored_zero = (zero.to(torch.int16) - self.zero_offset).clamp(0, 15)
        return {
            "qweight": codes_to_int32(codes).t().contiguous(),  # (K/8, N)
            "qzeros": codes_to_int32(stored_zero.t().contiguous()),  # (K/g, N/8)
            "scales": scale.to(self.scale_dtype).t().contiguous(),
            "g_idx": (torch.arange(k, dtype=torch.int32) // self.group(k)).to(weight.device),
        }


def parse_config(qc: dict[str, Any], hf: dict[str, Any], act_dtype: torch.dtype) -> QuantConfig:
    if int(qc.get("bits", 4)) != 4:
        raise UserError(f"GPTQ with {qc.get('bits')} bits is not supported (4 bits only)")
    if qc.get("desc_act"):
        raise UserError(
            "GPTQ checkpoints quantized with desc_act (act-order) are not supported; use one "
            "quantized with desc_act: false"
        )
    if qc.get("dynamic"):
        raise UserError("GPTQ checkpoints with per-module `dynamic` overrides are not supported")
    if qc.get("lm_head"):
        raise UserError("GPTQ checkpoints with a quantized lm_head are not supported")
    fmt_name = str(qc.get("checkpoint_format", "gptq")).lower()
    if fmt_name not in ("gptq", "gptq_v2"):
        raise UserError(f"GPTQ checkpoint_format {fmt_name!r} is not supported (gptq, gptq_v2)")
    group = int(qc.get("group_size", 128))
    if group not in (-1, 32, 64, 128):
        raise UserError(f"GPTQ group_size {group} is not supported (32, 64, 128 or -1)")
    fmt = GptqInt4(
        group_size=0 if group == -1 else group,
        has_zero=not qc.get("sym", True),
        scale_dtype=torch.float16,
        zero_offset=1 if fmt_name == "gptq" else 0,
    )
    ignore = ModuleMatcher(tuple(qc.get("modules_to_not_convert") or ()), "substring")
    return QuantConfig("gptq", fmt, ignore)
