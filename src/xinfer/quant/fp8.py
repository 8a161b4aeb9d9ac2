"""FP8 formats. Block (`quant_method: fp8`, DeepSeek-V3 / Qwen3-FP8 style): e4m3 weights
(N, K) with one float32 `weight_scale_inv` per `weight_block_size` block (default 128 x 128),
shape (ceil(N/bn), ceil(K/bk)); W = weight * weight_scale_inv (the name is historical: it
multiplies); without `weight_block_size`, one float32 `weight_scale` per module (vLLM's
serialized fp8). Per channel / per tensor (`Fp8Scaled`: that, ModelOpt FP8, compressed-tensors
float-quantized): a `weight_scale` per row (N, 1) or one per module, kept per row so that
merged parts keep their own. Activations stay in the model dtype (weight-only): static
input scales are read past, with a note."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from xinfer.errors import UserError
from xinfer.quant.base import KernelWeights, SharedKernelFormat, TensorSpec
from xinfer.quant.checks import cdiv, expect, float_scale
from xinfer.quant.config import ModuleMatcher, QuantConfig

logger = logging.getLogger("xinfer")
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


@dataclass(frozen=True, repr=False)
class Fp8Block(SharedKernelFormat):
    block_n: int = 128
    block_k: int = 128
    # prefill-sized expert calls in registers: Qwen3-30B-A3B MoE at 2,048 tokens 804.9 µs
    # against 2,890.6 dequantized (H100, 2026-12-05)
    dequant_experts_in_prefill = False
    # decode linears (H100, 2026-12-05, fifteenth session, `bench_quant_kernel.py
    # --decode-rows-sweep`), µs at 1 / 8 rows, qkv 5120 x 2048 and o_proj 2048 x 4096:
    # 8 x 256 of 8 warps 5.6 / 25.9 and 5.9 / 24.3; 32 x 256 of 4 warps 6.0 / 16.1 and
    # 5.2 / 13.6 (x loaded and converted once for 4x the output rows), rows alone and in
    # eight equal bit for bit
    decode_linear_tiles = (32, 256, 4)
    # every row of 16 alone equals its row in the batch at both shapes (H100, fifteenth session;
    # again with `factored_chunks`, thirty-first session)
    decode_one_row_alone = True
    # Qwen3-30B-A3B shape resident decode (H100, 2026-12-07, `bench_decode_switches.py`, one
    # process): 367.0 → 383.0 tok/s at batch 1, 1,067.0 → 1,051.8 at batch 8
    factored_chunks = True

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"fp8-block-{self.block_n}x{self.block_k}"

    def tensor_specs(self, n: int, k: int) -> dict[str, TensorSpec]:
        scales = (cdiv(n, self.block_n), cdiv(k, self.block_k))
        return {
            "weight": TensorSpec((n, k), FP8, n_block=1, k_block=1),
            "weight_scale_inv": TensorSpec(scales, torch.float32, self.block_n, self.block_k),
        }

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("weight", "weight_scale_inv", "input_scale")

    def required_checkpoint_names(self) -> tuple[str, ...]:
        return ("weight", "weight_scale_inv")

    def convert(self, name: str, tensor: torch.Tensor, n: int, k: int) -> dict[str, torch.Tensor]:
        if name == "weight":
            expect(self.name, name, tensor, (n, k), (FP8,))
            return {"weight": tensor}
        if name == "weight_scale_inv":
            shape = self.tensor_specs(n, k)["weight_scale_inv"].shape
            return {"weight_scale_inv": float_scale(self.name, name, tensor, shape, torch.float32)}
        return {}  # input_scale: static activation scales, unused by weight-only compute

    def dequantize(self, tensors: dict[str, torch.Tensor], n: int, k: int) -> torch.Tensor:
        s = tensors["weight_scale_inv"].float()
        dev = s.device
        rows = torch.arange(n, device=dev) // self.block_n
        cols = torch.arange(k, device=dev) // self.block_k
        return tensors["weight"].float() * s[rows][:, cols]

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per block: scale = amax / 448, weight = w / scale in e4m3 (DeepSeek's recipe)."""
        n, k = weight.shape
        bn, bk = min(self.block_n, n), min(self.block_k, k)  # a block wider than K: K
        w = weight.float()
        padded = torch.zeros(cdiv(n, bn) * bn, cdiv(k, bk) * bk, device=w.device)
        padded[:n, :k] = w
        blocks = padded.view(cdiv(n, bn), bn, cdiv(k, bk), bk)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX  # (N/bn, K/bk)
        q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        q = q.view(padded.shape)[:n, :k].contiguous()
        return {"weight": q, "weight_scale_inv": scale}

    def kernel_weights(self, tensors, k):
        w, s = tensors["weight"], tensors["weight_scale_inv"]
        return KernelWeights(1, w, s, None, self.block_n, self.block_k)


PER_ROW = 1 << 30  # a "block" wider than any row: one scale per row


@dataclass(frozen=True, repr=False)
class Fp8Scaled(Fp8Block):
    """e4m3 weight with a float `weight_scale` per row, per tensor or per (bn, bk) block (as
    compressed-tensors names it), stored per row / per block as `weight_scale_inv`."""

    block_n: int = 1
    block_k: int = PER_ROW
    per_tensor: bool = False  # how the producer (and our quantizer) writes `weight_scale`

    @property
    def name(self) -> str:  # type: ignore[override]
        if self.block_k == PER_ROW:
            return "fp8-per-channel"
        return f"fp8-block-{self.block_n}x{self.block_k}"

    def tensor_specs(self, n: int, k: int) -> dict[str, TensorSpec]:
        specs = super().tensor_specs(n, k)
        if self.block_k == PER_ROW:  # one scale per row: any K split keeps it whole
            specs["weight_scale_inv"] = TensorSpec((n, 1), torch.float32, 1, None)
        return specs

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("weight", "weight_scale", "input_scale")

    def required_checkpoint_names(self) -> tuple[str, ...]:
        return ("weight", "weight_scale")

    def convert(self, name: str, tensor: torch.Tensor, n: int, k: int) -> dict[str, torch.Tensor]:
        if name != "weight_scale":
            return super().convert(name, tensor, n, k)
        shape = self.tensor_specs(n, k)["weight_scale_inv"].shape
        if self.block_k == PER_ROW and tensor.numel() == 1:  # per tensor: the same every row
            tensor = tensor.reshape(1, 1).expand(shape)
        elif self.block_k == PER_ROW and tensor.dim() == 1:
            tensor = tensor.reshape(-1, 1)
        return {"weight_scale_inv": float_scale(self.name, name, tensor, shape, torch.float32)}

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.per_tensor:  # one scale: amax / 448 over the whole weight (ModelOpt FP8)
            scale = (weight.float().abs().amax().clamp(min=1e-12) / FP8_MAX).reshape(())
            q = (weight.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            return {"weight": q, "weight_scale": scale}
        out = super().quantize(weight)
        return {"weight": out["weight"], "weight_scale": out.pop("weight_scale_inv")}


def parse_config(qc: dict[str, Any], hf: dict[str, Any], act_dtype: torch.dtype) -> QuantConfig:
    fmt = str(qc.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise UserError(f"FP8 checkpoints with fmt {fmt!r} are not supported (only e4m3)")
    block = qc.get("weight_block_size")
    if block is not None and (len(block) != 2 or min(block) < 1):
        raise UserError(f"FP8 weight_block_size must be two positive sizes, got {block}")
    if qc.get("activation_scheme", "dynamic") != "dynamic":
        logger.info("FP8 checkpoint: static activation scales are not used (weight-only)")
    ignore = ModuleMatcher(tuple(qc.get("modules_to_not_convert") or ()), "substring")
    if block is None:  # one `weight_scale` a module (vLLM's and llm-compressor's older fp8)
        return QuantConfig("fp8", Fp8Scaled(per_tensor=True), ignore)
    return QuantConfig("fp8", Fp8Block(int(block[0]), int(block[1])), ignore)
