"""Plain float weights (bf16/fp16/fp32): one `weight` (N, K) in the model dtype, run by the
existing kernels (`kernels.linear`, `kernels.fused_moe`). A checkpoint in another float dtype
is cast on load, as before quantized formats existed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xinfer import kernels
from xinfer.errors import UserError
from xinfer.kernels import reference
from xinfer.quant.base import TensorSpec, WeightFormat

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True, repr=False)
class Unquantized(WeightFormat):
    dtype: torch.dtype = torch.float32
    is_quantized = False

    @property
    def name(self) -> str:  # type: ignore[override]
        return str(self.dtype).removeprefix("torch.")

    def tensor_specs(self, n: int, k: int) -> dict[str, TensorSpec]:
        return {"weight": TensorSpec((n, k), self.dtype, n_block=1, k_block=1)}

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("weight",)

    def convert(self, name: str, tensor: torch.Tensor, n: int, k: int) -> dict[str, torch.Tensor]:
        if tensor.dtype not in _FLOATS:
            raise UserError(
                f"checkpoint tensor {name!r} is {tensor.dtype}, but config.json declares no "
                "quantization; a quantized checkpoint needs its quantization_config"
            )
        return {"weight": tensor}

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"weight": weight.to(self.dtype)}

    def dummy(self, n: int, k: int, generator: torch.Generator, std: float) -> dict:
        w = torch.empty(n, k, dtype=self.dtype, device=generator.device)
        return {"weight": w.normal_(0, std, generator=generator)}

    def dequantize(self, tensors: dict[str, torch.Tensor], n: int, k: int) -> torch.Tensor:
        return tensors["weight"].float()

    def reference_linear(self, x, tensors, bias, n, k):
        return reference.linear(x, tensors["weight"], bias)

    def triton_linear(self, x, tensors, bias, n, k):
        return kernels.linear(x, tensors["weight"], bias)

    def reference_moe(self, hidden, topk_ids, topk_weights, w13, w2, inter):
        return reference.fused_moe(hidden, topk_ids, topk_weights, w13["weight"], w2["weight"])

    def triton_moe(self, hidden, topk_ids, topk_weights, w13, w2, inter, max_ids=None):
        # max_ids bounds the grouped path's align on a slot view (its rows, not its experts)
        from xinfer.kernels import moe_launch

        return moe_launch.fused_moe(
            hidden, topk_ids, topk_weights, w13["weight"], w2["weight"], max_ids=max_ids
        )

    def moe_merge_key(self, num_pairs, hidden):
        # the grouped GEMMs: a row's bits depend only on the tiles (the K order), never on
        # the other rows; GEMV-sized calls (and the CPU twin) are never joined
        from xinfer.kernels import moe_launch

        if not kernels.use_triton(hidden) or num_pairs <= moe_launch.MAX_GEMV_PAIRS:
            return None
        return moe_launch.grouped_config(num_pairs, hidden.dtype, hidden.device)
