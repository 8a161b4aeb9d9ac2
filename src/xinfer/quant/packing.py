"""4-bit packing shared by the int4 and fp4 formats. The engine stores 4-bit codes two per
byte along K, the even k in the low nibble: (N, K/2) uint8, which is also the byte view of
little-endian int32 words holding 8 codes at bits 4i (GPTQ along K, compressed-tensors)."""

from __future__ import annotations

import torch


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """(..., K/2) uint8 → (..., K) uint8 codes 0..15, low nibble first."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """(..., K) codes 0..15 (K even) → (..., K/2) uint8, low nibble first."""
    c = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, 2)
    return c[..., 0] | (c[..., 1] << 4)


def int32_to_codes(words: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """(..., W) int32 words of 8 codes → (..., 8W) codes; code `order[i]` of each word sits
    at bits 4i (identity: GPTQ / compressed-tensors; AWQ packs in its own order)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=words.device)
    codes = (words.unsqueeze(-1) >> shifts) & 0xF  # (..., W, 8) in bit order
    inverse = [order.index(j) for j in range(8)]
    codes = codes[..., inverse]
    return codes.reshape(*words.shape[:-1], -1).to(torch.uint8)


def codes_to_int32(codes: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """Inverse of `int32_to_codes`: (..., L) codes → (..., ceil(L/8)) int32 (zero-padded)."""
    c = codes.to(torch.int64)
    if c.shape[-1] % 8:
        c = torch.nn.functional.pad(c, (0, 8 - c.shape[-1] % 8))
    c = c.reshape(*codes.shape[:-1], -1, 8)[..., list(order)]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=codes.device)
    words = (c << shifts).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
