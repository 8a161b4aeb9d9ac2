"""GGUF block types: their byte layouts and the pure-torch dequantize twins. Each twin does
the same float32 operations in the same order as the `gguf` package's numpy dequantizer, so
the results are equal bit for bit (tested); the Triton kernels are tested against these.

A GGUF tensor of logical shape (..., K) is stored as (..., K / block_size * type_size) bytes:
every row is a run of blocks, each block holding `block_size` weights."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

QK_K = 256  # weights per K-quant super-block


@dataclass(frozen=True)
class BlockType:
    """One GGUF block type: `type_id` is ggml's enum value."""

    name: str
    type_id: int
    block_size: int  # weights per block
    type_size: int  # bytes per block
    dequantize_blocks: Callable[[torch.Tensor], torch.Tensor]  # (n, type_size) u8 → (n, bs) f32

    @property
    def is_float(self) -> bool:
        return self.block_size == 1

    def row_bytes(self, row_len: int) -> int:
        if row_len % self.block_size:
            raise ValueError(
                f"{self.name}: row length {row_len} is not a multiple of {self.block_size}"
            )
        return row_len // self.block_size * self.type_size


def _view(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return blocks.contiguous().view(dtype)


def _f16(b: torch.Tensor) -> torch.Tensor:
    return _view(b, torch.float16).float()  # (n, 1)


def _nibbles(qs: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """(n, groups*width) bytes → (n, groups, 2, width): low nibbles first, then high ones."""
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=qs.device).view(1, 1, 2, 1)
    return (qs.reshape(qs.shape[0], groups, 1, width) >> shifts) & 0x0F


def _f32(blocks: torch.Tensor) -> torch.Tensor:
    return _view(blocks, torch.float32)


def _f16_blocks(blocks: torch.Tensor) -> torch.Tensor:
    return _view(blocks, torch.float16).float()


def _bf16(blocks: torch.Tensor) -> torch.Tensor:
    return (_view(blocks, torch.int16).to(torch.int32) << 16).view(torch.float32)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks[:, :2])
    x = _view(blocks[:, 2:], torch.int8).float()
    return x * d


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d = _f16(blocks[:, :2])
    qs = _nibbles(blocks[:, 2:], 1, 16).reshape(n, 32).to(torch.int8) - 8
    return d * qs.float()


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d = _f16(blocks[:, :2])
    bits = torch.arange(8, dtype=torch.uint8, device=blocks.device).view(1, 1, 8)
    qh = ((blocks[:, 2:6].reshape(n, 4, 1) >> bits) & 1).reshape(n, 32)  # bit i of the u32
    ql = _nibbles(blocks[:, 6:], 1, 16).reshape(n, 32)
    qs = (ql | (qh << 4)).to(torch.int8) - 16
    return d * qs.float()


def k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins packed in 12 bytes (Q4_K, Q5_K) → two (n, 8) u8."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_scales(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d * scale, dmin * min) of Q4_K / Q5_K, each (n, 8, 1) float32."""
    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    sc, mn = k_scale_min(blocks[:, 4:16])
    return (d * sc.float()).reshape(n, -1, 1), (dmin * mn.float()).reshape(n, -1, 1)


def q4_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Q4_K blocks (n, 144) u8 → (d (n,), dmin (n,) float32; sc, mn (n, 8) u8; codes
    (n, 8, 32) u8): weight 32 s + l of a block is d·sc[s]·codes[s, l] − dmin·mn[s]."""
    n = blocks.shape[0]
    sc, mn = k_scale_min(blocks[:, 4:16])
    codes = _nibbles(blocks[:, 16:], 4, 32).reshape(n, 8, 32)
    return _f16(blocks[:, :2]).view(n), _f16(blocks[:, 2:4]).view(n), sc, mn, codes


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dm = _k_scales(blocks)
    qs = _nibbles(blocks[:, 16:], 4, 32).reshape(n, 8, 32).float()
    return (d * qs - dm).reshape(n, QK_K)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dm = _k_scales(blocks)
    bits = torch.arange(8, dtype=torch.uint8, device=blocks.device).view(1, 1, 8, 1)
    qh = ((blocks[:, 16:48].reshape(n, 1, 1, 32) >> bits) & 1).reshape(n, 8, 32)
    ql = _nibbles(blocks[:, 48:], 4, 32).reshape(n, 8, 32)
    q = (ql | (qh << 4)).float()
    return (d * q - dm).reshape(n, QK_K)


def q6_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Q6_K blocks (n, 210) u8 → (d (n,) float32; scales (n, 16) int8; codes (n, 16, 16) int8
    in [-32, 31]): weight 16 g + l of a block is d·scales[g]·codes[g, l]."""
    n = blocks.shape[0]
    scales = _view(blocks[:, 192:208], torch.int8)
    ql = _nibbles(blocks[:, :128], 2, 64).reshape(n, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=blocks.device).view(1, 1, 4, 1)
    qh = ((blocks[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 0x03).reshape(n, 8, 32)
    q = (ql | (qh << 4)).to(torch.int8) - 32
    return _f16(blocks[:, 208:210]).view(n), scales, q.reshape(n, QK_K // 16, 16)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, scales, q = q6_k_parts(blocks)
    return ((d[:, None] * scales.float())[:, :, None] * q.float()).reshape(n, QK_K)


BLOCK_TYPES: dict[str, BlockType] = {
    t.name: t
    for t in (
        BlockType("F32", 0, 1, 4, _f32),
        BlockType("F16", 1, 1, 2, _f16_blocks),
        BlockType("Q4_0", 2, 32, 18, _q4_0),
        BlockType("Q5_0", 6, 32, 22, _q5_0),
        BlockType("Q8_0", 8, 32, 34, _q8_0),
        BlockType("Q4_K", 12, QK_K, 144, _q4_k),
        BlockType("Q5_K", 13, QK_K, 176, _q5_k),
        BlockType("Q6_K", 14, QK_K, 210, _q6_k),
        BlockType("BF16", 30, 1, 2, _bf16),
    )
}
BY_ID: dict[int, BlockType] = {t.type_id: t for t in BLOCK_TYPES.values()}


def block_type(name_or_id: str | int) -> BlockType:
    table = BY_ID if isinstance(name_or_id, int) else BLOCK_TYPES
    key = name_or_id if isinstance(name_or_id, int) else name_or_id.upper()
    if key not in table:
        raise KeyError(f"GGUF block type {name_or_id!r} is not supported")
    return table[key]


def dequantize(raw: torch.Tensor, btype: BlockType, row_len: int) -> torch.Tensor:
    """raw (..., row_bytes) uint8 → (..., row_len) float32."""
    if raw.dtype != torch.uint8 or raw.shape[-1] != btype.row_bytes(row_len):
        raise ValueError(
            f"{btype.name}: expected uint8 rows of {btype.row_bytes(row_len)} bytes, "
            f"got {raw.dtype} {tuple(raw.shape)}"
        )
    lead = raw.shape[:-1]
    blocks = raw.reshape(-1, btype.type_size)
    return btype.dequantize_blocks(blocks).reshape(*lead, row_len)
