"""NVFP4 as ModelOpt exports it (`hf_quant_config.json` quant_algo NVFP4, or config.json
`quant_method: modelopt`): `weight` uint8 (N, K/2) e2m1 codes two per byte (low nibble
first), `weight_scale` float8_e4m3fn (N, K/16), `weight_scale_2` float32 scalar per module;
W = e2m1 * weight_scale * weight_scale_2. The engine keeps `weight_scale_2` per row (N,)
so that merged q|k|v and gate|up parts keep their own. Weight-only: `input_scale` (the
activation scale of W4A4) is read past."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xinfer.errors import UserError
from xinfer.quant.base import KernelWeights, SharedKernelFormat, TensorSpec
from xinfer.quant.checks import expect
from xinfer.quant.packing import pack_nibbles, unpack_nibbles

FP8 = torch.float8_e4m3fn
GROUP = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_table(device: torch.device | None = None) -> torch.Tensor:
    """Code 0..15 → value (bit 3 is the sign)."""
    pos = torch.tensor(E2M1_VALUES, device=device)
    return torch.cat([pos, -pos])


@dataclass(frozen=True, repr=False)
class Nvfp4(SharedKernelFormat):
    name = "nvfp4"

    def tensor_specs(self, n: int, k: int) -> dict[str, TensorSpec]:
        return {
            "weight": TensorSpec((n, k // 2), torch.uint8, n_block=1, k_block=2),
            "weight_scale": TensorSpec((n, k // GROUP), FP8, n_block=1, k_block=GROUP),
            "weight_scale_2": TensorSpec((n,), torch.float32, n_block=1, k_block=None),
        }

    def checkpoint_names(self) -> tuple[str, ...]:
        # input_scale: W4A4 activations; k_scale / v_scale: ModelOpt's FP8 KV-cache scales
        return ("weight", "weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale")

    def required_checkpoint_names(self) -> tuple[str, ...]:
        return ("weight", "weight_scale", "weight_scale_2")

    def convert(self, name: str, tensor: torch.Tensor, n: int, k: int) -> dict[str, torch.Tensor]:
        if k % GROUP:
            raise UserError(f"NVFP4 weights need K divisible by {GROUP}, got {k}")
        if name == "weight":
            expect(self.name, name, tensor, (n, k // 2), (torch.uint8,))
            return {"weight": tensor}
        if name == "weight_scale":
            expect(self.name, name, tensor, (n, k // GROUP), (FP8,))
            return {"weight_scale": tensor}
        if name == "weight_scale_2":
            if tensor.numel() != 1 or tensor.dtype != torch.float32:
                expect(self.name, name, tensor, (), (torch.float32,))
            return {"weight_scale_2": tensor.reshape(1).expand(n).contiguous()}
        return {}  # activation and KV-cache scales: unused by weight-only compute

    def dequantize(self, tensors: dict[str, torch.Tensor], n: int, k: int) -> torch.Tensor:
        codes = unpack_nibbles(tensors["weight"]).long()
        vals = e2m1_table(codes.device)[codes]
        scale = tensors["weight_scale"].float().repeat_interleave(GROUP, dim=1)
        return vals * (scale * tensors["weight_scale_2"].float()[:, None])

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """ModelOpt's recipe: global = amax / (448 * 6); block scale = block amax / 6 /
        global in e4m3; codes = nearest e2m1 of w / (scale * global)."""
        n, k = weight.shape
        w = weight.float()
        global_scale = (w.abs().amax() / (448.0 * 6.0)).clamp(min=1e-12)
        blocks = w.reshape(n, k // GROUP, GROUP)
        scale = (blocks.abs().amax(-1) / 6.0 / global_scale).clamp(-448, 448).to(FP8)
        denom = scale.float() * global_scale
        x = blocks / torch.where(denom == 0, torch.ones_like(denom), denom)[..., None]
        table = e2m1_table(w.device)
        codes = (x.reshape(n, k, 1) - table).abs().argmin(-1)  # nearest value (ties: lower code)
        return {
            "weight": pack_nibbles(codes),
            "weight_scale": scale,
            "weight_scale_2": global_scale.reshape(()),
            "input_scale": torch.ones((), device=w.device),
        }

    def kernel_weights(self, tensors, k):
        w, s, s2 = tensors["weight"], tensors["weight_scale"], tensors["weight_scale_2"]
        return KernelWeights(3, w, s, s2, 1, GROUP)
