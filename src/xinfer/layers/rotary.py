"""Rotary position embedding: builds the float32 cos/sin table once (default, linear, llama3
and yarn frequency rules, as the HF configs of our models use them). It is applied by
`PagedAttention.prepare_qkv`, fused with the q/k norms and the KV-cache store."""

from __future__ import annotations

import math

import torch
from torch import nn

from xinfer.config import RopeConfig


def _yarn_inv_freq(dim: int, rope: RopeConfig, max_pos: int) -> tuple[torch.Tensor, float]:
    factor = rope.factor
    orig = rope.original_max_position_embeddings or max_pos

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        attn_factor = mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim)
    else:
        attn_factor = mscale(factor)

    def correction_dim(num_rot: float) -> float:
        return (dim * math.log(orig / (num_rot * 2 * math.pi))) / (2 * math.log(rope.theta))

    low = max(math.floor(correction_dim(rope.beta_fast)), 0)
    high = min(math.ceil(correction_dim(rope.beta_slow)), dim - 1)
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = (torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 0.001)
    extra_factor = 1 - ramp.clamp(0, 1)
    inv_freq = interpolation * (1 - extra_factor) + extrapolation * extra_factor
    return inv_freq, attn_factor


def _llama3_inv_freq(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    orig = rope.original_max_position_embeddings or 8192
    low_wavelen = orig / rope.low_freq_factor
    high_wavelen = orig / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (orig / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def build_cos_sin_cache(head_dim: int, rope: RopeConfig, max_pos: int) -> torch.Tensor:
    """(max_pos, head_dim) float32: cos in the first half, sin in the second."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    scale = 1.0
    if rope.rope_type == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, rope)
    elif rope.rope_type == "yarn":
        inv_freq, scale = _yarn_inv_freq(head_dim, rope, max_pos)
    if rope.freq_factors:  # llama.cpp divides each frequency by its factor
        if len(rope.freq_factors) != head_dim // 2:
            raise ValueError(f"{len(rope.freq_factors)} RoPE factors for head_dim {head_dim}")
        inv_freq = inv_freq / torch.tensor(rope.freq_factors, dtype=torch.float32)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)  # (P, D/2)
    return torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)


class RotaryEmbedding(nn.Module):
    """Holds the table as a buffer, so that it follows the model to its device."""

    def __init__(self, head_dim: int, rope: RopeConfig, max_pos: int) -> None:
        super().__init__()
        self.cos_sin_cache = nn.Buffer(
            build_cos_sin_cache(head_dim, rope, max_pos), persistent=False
        )
