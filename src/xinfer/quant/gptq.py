"""GPTQ (AutoGPTQ / GPTQModel `quant_method: gptq`, 4 bits): `qweight` int32 (K/8, N) packed
along K, `qzeros` int32 (K/g, N/8) packed along N, `scales` fp16 (K/g, N), `g_idx` int32 (K).
The v1 checkpoint format stores zero - 1 (`checkpoint_format: gptq`); `gptq_v2` stores the
zero itself. Symmetric checkpoints carry the constant zero 8. Act-order (`desc_act`): qweight
is in input-channel order and channel k belongs to group g_idx[k]; the codes are sorted by
group after load (`quant/act_order.py`). Converted into the int4 layout of `quant/int4.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from xinfer.errors import UserError
from xinfer.quant import act_order
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
        return self.checkpoint_names() if self.act_order else ("qweight", "qzeros", "scales")

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
        if self.act_order:
            return {"perm": act_order.perm_from_g_idx(tensor, k, self.group(k), "GPTQ")}
        if not torch.equal(tensor.long().cpu(), torch.arange(k) // self.group(k)):
            raise UserError(
                "GPTQ checkpoint has an act-order g_idx but its quantization_config says "
                "desc_act: false; set desc_act: true in config.json"
            )
        return {}

    def quantize(
        self, weight: torch.Tensor, perm: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Round-to-nearest into AutoGPTQ's on-disk layout (v1 zero offset applied); with
        `perm` (act-order formats) the columns are grouped in that order, as desc_act does."""
        if perm is not None and not self.act_order:
            raise ValueError(f"{self.name}: a column order needs an act-order format")
        codes, scale, zero, g_idx = act_order.quantize_in_order(self, weight, perm)
        stored_zero = (zero.to(torch.int16) - self.zero_offset).clamp(0, 15)
        return {
            "qweight": codes_to_int32(codes).t().contiguous(),  # (K/8, N)
            "qzeros": codes_to_int32(stored_zero.t().contiguous()),  # (K/g, N/8)
            "scales": scale.to(self.scale_dtype).t().contiguous(),
            "g_idx": g_idx,
        }


def parse_config(qc: dict[str, Any], hf: dict[str, Any], act_dtype: torch.dtype) -> QuantConfig:
    if int(qc.get("bits", 4)) != 4:
        raise UserError(f"GPTQ with {qc.get('bits')} bits is not supported (4 bits only)")
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
        # one group a row: every channel in group 0, the order is moot
        act_order=bool(qc.get("desc_act")) and group != -1,
    )
    ignore = ModuleMatcher(tuple(qc.get("modules_to_not_convert") or ()), "substring")
    return QuantConfig("gptq", fmt, ignore)
