"""TurboQuant (MSE) KV cache: each (token, KV head) vector x of K and of V is rotated,
y = R x, and stored as b-bit Lloyd–Max codes c of y / sigma (sigma = |y| / sqrt(D)) plus one
float16 scale s = <y, c> / <c, c> (the least-squares fit), so y ~ s * c. 4-bit codes are
packed two a byte (coordinate 2j in byte j's low nibble, 2j + 1 in its high one); 3-bit codes
as their low two bits four a byte (D / 4 bytes, coordinate 4j + i at bits 2i, 2i + 1 of byte
j) then their high bit eight a byte (D / 8 bytes, coordinate 8j + i at bit i). Either is
b * D / 8 bytes a row, laid out so that the attention kernels read a row's bytes as vectors
and unpack them in a few instructions a coordinate (bit-planes took ~28: SASS, thirtieth
session).

Attention never un-rotates the cache: q is rotated once (q R^T), scores and the weighted
sum of V are taken in rotated space, and the output is rotated back once (out R). This module
holds the cache object and the pure-torch twin (quantize, pack, dequantize, store); the
kernels' dispatch is `kernels/kv_turbo.py`. Reference: Zandieh et al. 2025, arXiv 2504.19874."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xinfer.kv.format import TurboQuant, check_turbo_head_dim
from xinfer.kv.turbo_codebook import rotation, tables

FP16_MAX = 65504.0


@dataclass
class TurboKVCache:
    """One attention layer's TurboQuant cache. Codes (num_blocks, block_size, Hk, b * D / 8)
    uint8 and scales (num_blocks, block_size, Hk) float16, for K and for V, all contiguous;
    the tables are shared by every layer."""

    k_codes: torch.Tensor
    k_scales: torch.Tensor
    v_codes: torch.Tensor
    v_scales: torch.Tensor
    bits: int
    rotation: torch.Tensor  # R (D, D) in the model dtype, on the cache's device
    centroids: torch.Tensor  # (2^b,) float32
    boundaries: torch.Tensor  # (2^b - 1,) float64 midpoints of the centroids

    @property
    def head_dim(self) -> int:
        return self.rotation.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.k_codes.shape[2]

    @property
    def block_size(self) -> int:
        return self.k_codes.shape[1]

    @property
    def device(self) -> torch.device:
        return self.k_codes.device

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.k_codes, self.k_scales, self.v_codes, self.v_scales


def allocate(
    fmt: TurboQuant,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> TurboKVCache:
    """A zeroed cache; `dtype` is the model's (the rotations run in it)."""
    check_turbo_head_dim(head_dim, fmt)
    centroids, boundaries = tables(head_dim, fmt.bits)
    codes_shape = (num_blocks, block_size, num_kv_heads, fmt.code_bytes(head_dim))

    def codes() -> torch.Tensor:
        return torch.zeros(codes_shape, dtype=torch.uint8, device=device)

    def scales() -> torch.Tensor:
        return torch.zeros(codes_shape[:3], dtype=torch.float16, device=device)

    return TurboKVCache(
        codes(), scales(), codes(), scales(), fmt.bits,
        rotation(head_dim).to(device=device, dtype=dtype),
        centroids.to(device), boundaries.to(device),
    )  # fmt: skip


def quantize(
    y: torch.Tensor, centroids: torch.Tensor, boundaries: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated rows y (..., D) → indices (..., D) int64 and scales (...) float16. Float64
    throughout (the kernel's too), so the two agree bit for bit whatever their sum orders."""
    y = y.double()
    head_dim = y.shape[-1]
    sigma = torch.sqrt((y * y).sum(-1, keepdim=True) / head_dim)
    t = y / torch.where(sigma > 0, sigma, torch.ones_like(sigma))
    idx = (t.unsqueeze(-1) > boundaries.to(t.device)).sum(-1)  # boundaries below t
    c = centroids.to(y.device)[idx].double()
    scale = (y * c).sum(-1) / (c * c).sum(-1)
    return idx, scale.clamp(-FP16_MAX, FP16_MAX).float().half()


def pack(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """Indices (..., D) → codes (..., bits * D / 8) uint8. 4 bits: byte j holds coordinate 2j
    in its low nibble and 2j + 1 in its high one. 3 bits: D / 4 bytes of low bit pairs
    (coordinate 4j + i at bits 2i, 2i + 1 of byte j), then D / 8 bytes of high bits
    (coordinate 8j + i at bit i of byte j)."""
    lead, head_dim = idx.shape[:-1], idx.shape[-1]
    if bits == 4:
        pairs = idx.reshape(*lead, head_dim // 2, 2)
        return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)
    if bits != 3:
        raise ValueError(f"turbo codes are 3 or 4 bits, not {bits}")
    shifts = torch.arange(8, device=idx.device)
    low = ((idx & 3).reshape(*lead, head_dim // 4, 4) << (2 * shifts[:4])).sum(-1)
    high = (((idx >> 2) & 1).reshape(*lead, head_dim // 8, 8) << shifts).sum(-1)
    return torch.cat((low, high), -1).to(torch.uint8)


def unpack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """`pack`'s inverse: (..., bits * D / 8) uint8 → indices (..., D) int64."""
    lead, width = codes.shape[:-1], codes.shape[-1]
    b = codes.long()
    if bits == 4:
        return torch.stack((b & 15, b >> 4), -1).reshape(*lead, 2 * width)
    if bits != 3:
        raise ValueError(f"turbo codes are 3 or 4 bits, not {bits}")
    head_dim = width * 8 // 3
    low, high = b[..., : head_dim // 4], b[..., head_dim // 4 :]
    low = (low.unsqueeze(-1) >> (torch.arange(4, device=b.device) * 2)) & 3
    high = (high.unsqueeze(-1) >> torch.arange(8, device=b.device)) & 1
    return low.reshape(*lead, head_dim) | (high.reshape(*lead, head_dim) << 2)


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, centroids: torch.Tensor, bits: int
) -> torch.Tensor:
    """Codes (..., b * D / 8) and scales (...) → rotated rows s * c (..., D) float32."""
    return centroids[unpack(codes, bits)] * scales.float().unsqueeze(-1)


def store(k_rot: torch.Tensor, v_rot: torch.Tensor, cache: TurboKVCache, slots: torch.Tensor):
    """Quantize rotated k/v (T, Hk, D) into `cache` at flat slots (T,) = block * block_size +
    offset; slots < 0 (padding) write nothing."""
    valid = slots >= 0
    flat = slots[valid].long()
    for rows, codes, scales in ((k_rot, cache.k_codes, cache.k_scales),
                                (v_rot, cache.v_codes, cache.v_scales)):  # fmt: skip
        idx, scale = quantize(rows[valid], cache.centroids, cache.boundaries)
        codes.view(-1, *codes.shape[2:])[flat] = pack(idx, cache.bits)
        scales.view(-1, scales.shape[2])[flat] = scale


def dense_blocks(
    cache: TurboKVCache, block_tables: torch.Tensor, seq_lens: list[int], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The blocks the sequences reach, dequantized: dense rotated K and V (U, block_size,
    Hk, D) in `dtype` and the block tables renumbered into them, for attention code that
    reads a plain cache (the CPU twin, the flash prefill path)."""
    bs = cache.block_size
    reach = max(-(-n // bs) for n in seq_lens) if seq_lens else 0
    used = torch.unique(block_tables[:, : max(reach, 1)].long())  # sorted
    tables_new = torch.searchsorted(used, block_tables.long()).clamp_max(used.numel() - 1)
    k = dequantize(cache.k_codes[used], cache.k_scales[used], cache.centroids, cache.bits)
    v = dequantize(cache.v_codes[used], cache.v_scales[used], cache.centroids, cache.bits)
    return k.to(dtype), v.to(dtype), tables_new.to(block_tables.dtype)
