"""Dequantization of each checkpoint format written from its producer's published formula,
independently of the engine's code: the ground truth our loaded weights and greedy tokens
are compared with. Each takes the checkpoint tensors of one module and returns (N, K) fp32."""

from __future__ import annotations

import torch

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ gemm: bits 4i of a word hold column order[i]


def fp8_block(t: dict, block: tuple[int, int]) -> torch.Tensor:
    """DeepSeek-V3 `weight_dequant`: weight (N, K) e4m3 times its block's weight_scale_inv."""
    w, s = t["weight"].float(), t["weight_scale_inv"].float()
    n, k = w.shape
    out = torch.empty(n, k)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            rows, cols = (
                slice(i * block[0], (i + 1) * block[0]),
                slice(j * block[1], (j + 1) * block[1]),
            )
            out[rows, cols] = w[rows, cols] * s[i, j]
    return out


def fp8_scaled(t: dict) -> torch.Tensor:
    """compressed-tensors float-quantized / ModelOpt FP8: weight x weight_scale, one scale per
    row (N, 1) or per tensor."""
    s = t["weight_scale"].float()
    return t["weight"].float() * (s.reshape(-1, 1) if s.numel() > 1 else s.reshape(()))


def nvfp4(t: dict) -> torch.Tensor:
    """ModelOpt NVFP4: e2m1 codes two per byte (low nibble first) x e4m3 scale per 16 x the
    per-tensor weight_scale_2."""
    packed = t["weight"]
    n = packed.shape[0]
    vals = torch.empty(n, packed.shape[1] * 2)
    lut = torch.tensor(E2M1)
    vals[:, 0::2] = lut[(packed & 0xF).long()]
    vals[:, 1::2] = lut[(packed >> 4).long()]
    scale = t["weight_scale"].float().repeat_interleave(16, dim=1)
    return vals * (scale * t["weight_scale_2"].float())


def _nibbles(word: torch.Tensor, i: int) -> torch.Tensor:
    return (word >> (4 * i)) & 0xF


def gptq(t: dict, group: int, zero_offset: int = 1) -> torch.Tensor:
    """AutoGPTQ: qweight (K/8, N) packed along K, qzeros (K/g, N/8) along N, scales
    (K/g, N), g_idx (K,) the group of each input channel (act-order: not contiguous);
    W[n, k] = (q[k, n] - (z[g_idx[k], n] + 1)) * s[g_idx[k], n] with the v1 zero offset."""
    qw, qz, s = t["qweight"], t["qzeros"], t["scales"].float()
    k, n = qw.shape[0] * 8, qw.shape[1]
    q = torch.empty(k, n)
    for i in range(8):
        q[i::8] = _nibbles(qw, i).float()
    z = torch.empty(qz.shape[0], n)
    for i in range(8):
        z[:, i::8] = _nibbles(qz, i).float()
    g = torch.arange(k) // group if "g_idx" not in t else t["g_idx"].long()
    return ((q - (z[g] + zero_offset)) * s[g]).t().contiguous()


def awq(t: dict, group: int) -> torch.Tensor:
    """AutoAWQ gemm: qweight (K, N/8) and qzeros (K/g, N/8) packed along N in AWQ's order;
    W[n, k] = (q - z) * s."""
    qw, qz, s = t["qweight"], t["qzeros"], t["scales"].float()
    k, n = qw.shape[0], qw.shape[1] * 8
    q, z = torch.empty(k, n), torch.empty(qz.shape[0], n)
    for i, col in enumerate(AWQ_ORDER):
        q[:, col::8] = _nibbles(qw, i).float()
        z[:, col::8] = _nibbles(qz, i).float()
    g = torch.arange(k) // group
    return ((q - z[g]) * s[g]).t().contiguous()
