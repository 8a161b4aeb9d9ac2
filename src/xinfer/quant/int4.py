"""The engine's int4 weight-only layout, shared by GPTQ, AWQ and compressed-tensors
`pack-quantized` (each converts its own checkpoint packing into it at load):
`qweight` (N, K/2) uint8 codes 0..15 (even k in the low nibble), `scales` (N, K/g) and,
when asymmetric, `zeros` (N, K/g) uint8 codes (symmetric: 8). W = (q - z) * s. Act-order
checkpoints (`act_order`) add `perm` (K,): the codes are sorted by scale group at load and
column j of that layout is input channel perm[j] (`quant/act_order.py`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xinfer.quant import act_order
from xinfer.quant.base import KernelWeights, SharedKernelFormat, TensorSpec
from xinfer.quant.checks import cdiv
from xinfer.quant.packing import unpack_nibbles

SYM_ZERO = 8


@dataclass(frozen=True, repr=False)
class Int4Grouped(SharedKernelFormat):
    """`group_size` 0 means one group per row (per-channel scales). `act_order`: the
    checkpoint's groups are given by a g_idx; the engine keeps the codes sorted by group and
    `perm` (K,), and a routed expert's w2 perm folded into its w13 rows (`finish_experts`)."""

    group_size: int = 128
    has_zero: bool = False
    scale_dtype: torch.dtype = torch.float16
    producer: str = "int4"
    act_order: bool = False
    # prefill-sized expert calls in registers: Qwen3-30B-A3B MoE at 2,048 tokens (GPTQ g128)
    # 2,259.7 µs against 3,187.5 dequantized (H100, 2026-12-05); NVFP4 keeps the dequantized
    # route (3,829.4 against 4,368.4 in registers)
    dequant_experts_in_prefill = False
    # MoE GEMV (H100, 2026-12-05, GPTQ g128), µs at 1 / 8 tokens: 512 columns a step, gate
    # and up one loop after the other 31.7 / 204.3; joined 32.1 / 189.9; 2,048 columns 27.7 /
    # 185.9; 2,048 columns joined (fifteenth session) 25.6 / 183.7 against 27.1 / 186.1
    moe_gemv_block_k = 2048
    moe_gemv_joined = True
    # decode linears (H100, 2026-12-05, fifteenth session, GPTQ g128, `bench_quant_kernel.py
    # --decode-rows-sweep`), µs at 1 / 8 rows, qkv 5120 x 2048 and o_proj 2048 x 4096:
    # 8 x 512 of 8 warps 8.7 / 31.9 and 8.6 / 26.7; 16 x 512 of 4 warps 8.3 / 30.5 and
    # 7.2 / 25.8, rows alone and in eight equal bit for bit (8 x 512 of 4 warps, 7.4 / 28.1
    # and 7.8 / 27.7, was not: rows differed at 2048 x 4096)
    decode_linear_tiles = (16, 512, 4)
    # in-register MoE at 2,048 tokens (H100, 2026-12-05, fourteenth session, GPTQ g128, each
    # tile checked against the twin; `bench_quant_kernel.py --prefill-sweep`): 64 x 64 x 64 of
    # 4 warps 2,315.5 µs; 128 x 64 x 64 of 8 warps, 3 stages 1,214.6 (4 stages 1,225.5;
    # 128 x 64 x 128 of 4 warps 1,271.1): a 128-row tile decodes each weight once for twice
    # the rows (dequantized route 2,098.8)
    moe_prefill_tiles = (128, 64, 64, 8, 3)

    @property
    def name(self) -> str:  # type: ignore[override]
        kind = "asym" if self.has_zero else "sym"
        order = "-actorder" if self.act_order else ""
        return f"{self.producer}-int4-g{self.group_size or 'row'}-{kind}{order}"

    def group(self, k: int) -> int:
        return self.group_size or k

    def tensor_specs(self, n: int, k: int) -> dict[str, TensorSpec]:
        g = self.group(k)
        specs = {
            "qweight": TensorSpec((n, cdiv(k, 2)), torch.uint8, n_block=1, k_block=2),
            "scales": TensorSpec((n, cdiv(k, g)), self.scale_dtype, n_block=1, k_block=g),
        }
        if self.has_zero:
            specs["zeros"] = TensorSpec((n, cdiv(k, g)), torch.uint8, n_block=1, k_block=g)
        if self.act_order:  # no N dim: one perm for every row (and every merged part)
            specs["perm"] = TensorSpec((k,), act_order.perm_dtype(k), n_block=None, k_block=1)
        return specs

    def dequantize(self, tensors: dict[str, torch.Tensor], n: int, k: int) -> torch.Tensor:
        g = self.group(k)
        q = unpack_nibbles(tensors["qweight"])[:, :k].float()
        s = tensors["scales"].float().repeat_interleave(g, dim=1)[:, :k]
        if self.has_zero:
            z = tensors["zeros"].float().repeat_interleave(g, dim=1)[:, :k]
        else:
            z = torch.full_like(q, SYM_ZERO)
        w = (q - z) * s
        return act_order.unsort_columns(w, tensors["perm"]) if "perm" in tensors else w

    @property
    def splits_for_tensor_parallel(self) -> bool:
        return not self.act_order  # a K split would cut through the scale groups

    def finish_loading(self, tensors, n, k):
        if self.act_order:
            act_order.check_perm(tensors["perm"], k)
            act_order.sort_columns(tensors["qweight"], tensors["perm"])

    def finish_experts(self, w13, w2, hidden, inter):
        if not self.act_order:
            return
        for e in range(w13["qweight"].shape[0]):
            one13 = {name: t[e] for name, t in w13.items()}
            self.finish_loading(one13, 2 * inter, hidden)
            self.finish_loading({name: t[e] for name, t in w2.items()}, hidden, inter)
            act_order.fold_down_perm(one13, w2["perm"][e], inter)

    def reference_moe(self, hidden, topk_ids, topk_weights, w13, w2, inter, w2_fmt=None):
        # act-order: w2's perm is folded into w13's rows, so w2 runs in its sorted order
        w2 = {name: t for name, t in w2.items() if name != "perm"}
        return super().reference_moe(hidden, topk_ids, topk_weights, w13, w2, inter, w2_fmt)

    def triton_moe(self, hidden, topk_ids, topk_weights, w13, w2, inter, max_ids=None):
        w2 = {name: t for name, t in w2.items() if name != "perm"}  # folded (reference_moe)
        return super().triton_moe(hidden, topk_ids, topk_weights, w13, w2, inter, max_ids)

    def dummy(self, n, k, generator, std):
        # act-order: a random column order, so benchmarks pay the gather (an expert's w2 perm
        # is left unfolded: its weights are random either way)
        if not self.act_order:
            return super().dummy(n, k, generator, std)
        w = torch.empty(n, k, dtype=torch.float32, device=generator.device)
        perm = torch.randperm(k, generator=generator, device=generator.device)
        return self.engine_tensors(w.normal_(0, std, generator=generator), perm=perm)

    def quantize_codes(self, weight: torch.Tensor):
        """Round-to-nearest group quantization of (N, K) → (codes (N, K) 0..15 uint8,
        scales (N, K/g) fp32, zero codes (N, K/g) uint8)."""
        n, k = weight.shape
        g = self.group(k)
        w = weight.float().reshape(n, k // g, g)
        if self.has_zero:
            lo, hi = w.amin(-1).clamp(max=0), w.amax(-1).clamp(min=0)
            scale = ((hi - lo) / 15).clamp(min=1e-8)
            zero = torch.round(-lo / scale).clamp(0, 15)
        else:
            scale = (w.abs().amax(-1) / 7).clamp(min=1e-8)
            zero = torch.full_like(scale, SYM_ZERO)
        scale = scale.to(self.scale_dtype).float()  # the stored scale is what dequant uses
        q = torch.round(w / scale[..., None] + zero[..., None]).clamp(0, 15)
        return q.reshape(n, k).to(torch.uint8), scale, zero.to(torch.uint8)

    def kernel_weights(self, tensors, k):
        w, s, z = tensors["qweight"], tensors["scales"], tensors.get("zeros")
        perm = tensors.get("perm")  # absent: plain, or an expert's folded w2 (reference_moe)
        return KernelWeights(2, w, s, z, 1, self.group(k), self.has_zero, perm)
