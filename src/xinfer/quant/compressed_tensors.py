"""compressed-tensors (`quant_method: compressed-tensors`). `float-quantized` FP8 (e4m3 with a
`weight_scale` per channel, tensor or block; dynamic activations are left unquantized) is
read by `quant/fp8.py`'s Fp8Scaled. `pack-quantized` (llm-compressor's W4A16, `quant_method:
compressed-tensors`): `weight_packed` int32 (N, K/8) with 8 codes per word at bits 4i, each
the signed value + 8; `weight_scale` (N, K/g) in the model dtype; when asymmetric
`weight_zero_point` int32 (N/8, K/g) packed along N the same way; `weight_shape` = [N, K].
W = (q - 8 - zp) * s. Converted at load into the int4 layout of `quant/int4.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from xinfer.config import parse_dtype
from xinfer.errors import UserError
from xinfer.quant.checks import cdiv, expect, float_scale
from xinfer.quant.config import ModuleMatcher, QuantConfig
from xinfer.quant.fp8 import Fp8Scaled
from xinfer.quant.int4 import Int4Grouped
from xinfer.quant.packing import codes_to_int32, int32_to_codes


@dataclass(frozen=True, repr=False)
class PackQuantizedInt4(Int4Grouped):
    producer: str = "ct"

    def checkpoint_names(self) -> tuple[str, ...]:
        names = ("weight_packed", "weight_scale", "weight_shape")
        return (*names, "weight_zero_point") if self.has_zero else names

    def convert(self, name: str, tensor: torch.Tensor, n: int, k: int) -> dict[str, torch.Tensor]:
        groups = cdiv(k, self.group(k))
        if name == "weight_packed":
            expect(self.name, name, tensor, (n, cdiv(k, 8)), (torch.int32,))
            # little-endian int32 words of nibbles are exactly the engine's byte layout
            return {"qweight": tensor.contiguous().view(torch.uint8)[:, : cdiv(k, 2)]}
        if name == "weight_scale":
            s = float_scale(self.name, name, tensor, (n, groups), self.scale_dtype)
            return {"scales": s}
        if name == "weight_zero_point":
            expect(self.name, name, tensor, (cdiv(n, 8), groups), (torch.int32,))
            zp = int32_to_codes(tensor.t().contiguous())[:, :n].t()  # (N, K/g) zp + 8
            return {"zeros": zp.contiguous()}
        expect(self.name, name, tensor, (2,), (torch.int32, torch.int64))  # weight_shape
        if tensor.tolist() != [n, k]:
            raise UserError(f"weight_shape {tensor.tolist()} does not match the model's {[n, k]}")
        return {}

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        n, k = weight.shape
        codes, scale, zero = self.quantize_codes(weight)
        out = {
            "weight_packed": codes_to_int32(codes),  # (N, K/8)
            "weight_scale": scale.to(self.scale_dtype),
            "weight_shape": torch.tensor([n, k], dtype=torch.int64),
        }
        if self.has_zero:
            out["weight_zero_point"] = codes_to_int32(zero.t().contiguous()).t().contiguous()
        return out


def _only_scheme(qc: dict[str, Any]) -> dict[str, Any]:
    groups = qc.get("config_groups") or {}
    schemes = [g for g in groups.values() if isinstance(g, dict)]
    if len(schemes) != 1:
        raise UserError(
            "compressed-tensors checkpoints with several config_groups are not supported"
        )
    return schemes[0]


def _weights_scheme(qc: dict[str, Any]) -> dict[str, Any]:
    scheme = _only_scheme(qc)
    if scheme.get("input_activations"):
        raise UserError(
            "compressed-tensors checkpoints that quantize activations are not supported; "
            "xinfer reads weight-only pack-quantized (W4A16) ones"
        )
    return scheme.get("weights") or {}


def _fp8_format(w: dict[str, Any]) -> Fp8Scaled:
    """float-quantized: e4m3 weights with `weight_scale` per channel, tensor or block."""
    if w.get("num_bits") != 8 or w.get("type") != "float":
        raise UserError("compressed-tensors float-quantized: only 8-bit float weights are read")
    strategy = w.get("strategy", "channel")
    if strategy in ("channel", "tensor"):
        return Fp8Scaled(per_tensor=strategy == "tensor")
    if strategy == "block":
        bn, bk = w.get("block_structure") or (128, 128)
        return Fp8Scaled(int(bn), int(bk))
    raise UserError(f"compressed-tensors fp8 weight strategy {strategy!r} is not supported")


def parse_config(qc: dict[str, Any], hf: dict[str, Any], act_dtype: torch.dtype) -> QuantConfig:
    fmt_name = qc.get("format")
    if fmt_name not in ("pack-quantized", "float-quantized"):
        raise UserError(
            f"compressed-tensors format {fmt_name!r} is not supported; xinfer reads "
            "pack-quantized (W4A16) and float-quantized (FP8)"
        )
    ignore = ModuleMatcher(tuple(qc.get("ignore") or ()), "exact")
    if fmt_name == "float-quantized":
        scheme = _only_scheme(qc)
        if (scheme.get("input_activations") or {}).get("dynamic") is False:
            raise UserError("compressed-tensors FP8 with static activation scales is not supported")
        return QuantConfig("compressed-tensors", _fp8_format(scheme.get("weights") or {}), ignore)
    w = _weights_scheme(qc)
    if w.get("num_bits") != 4 or w.get("type", "int") != "int":
        raise UserError("compressed-tensors pack-quantized: only 4-bit int weights are supported")
    strategy = w.get("strategy", "group")
    if strategy not in ("group", "channel"):
        raise UserError(f"compressed-tensors weight strategy {strategy!r} is not supported")
    # `weight` (alias `static`) orders the calibration only: groups stay contiguous, no g_idx
    if w.get("actorder") not in (None, False, "weight", "static"):
        raise UserError(
            "compressed-tensors checkpoints with actorder: group (a weight_g_idx) are not "
            "supported; use one quantized with actorder: weight"
        )
    group = int(w.get("group_size") or 0) if strategy == "group" else 0
    if strategy == "group" and group not in (32, 64, 128):
        raise UserError(f"compressed-tensors group_size {group} is not supported (32, 64, 128)")
    scale_dtype = parse_dtype(str(hf.get("dtype") or hf.get("torch_dtype") or "bfloat16"))
    fmt = PackQuantizedInt4(
        group_size=group,
        has_zero=not w.get("symmetric", True),
        scale_dtype=scale_dtype or torch.bfloat16,
    )
    return QuantConfig("compressed-tensors", fmt, ignore)
