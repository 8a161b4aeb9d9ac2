"""In-register dequantization of GGUF blocks (used by `gguf_gemm.py`): `gguf_tile` reads the
raw bytes of BLOCK_N rows over a chunk of SUBS sub-blocks of 32 weights and returns the
float32 weights as a (BLOCK_N, SUBS, 32) tile, with the per-sub-block scales decoded once
per (row, sub-block) and broadcast. Each weight is computed with the float32 operations of
its twin in `quant/gguf_blocks.py`. `BTYPE` is ggml's type id."""

from __future__ import annotations

import triton
import triton.language as tl

Q4_0 = tl.constexpr(2)
Q5_0 = tl.constexpr(6)
Q8_0 = tl.constexpr(8)
Q4_K = tl.constexpr(12)
Q5_K = tl.constexpr(13)
Q6_K = tl.constexpr(14)


@triton.jit
def _u8(ptr, off, mask):
    return tl.load(ptr + off, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(ptr, off, mask):
    """The little-endian float16 at byte offsets `off`, as float32."""
    bits = _u8(ptr, off, mask) | (_u8(ptr, off + 1, mask) << 8)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _minus(q, offset: tl.constexpr):
    """float32(q - offset), exactly, for int32 0 <= q < 2^23: q OR-ed into the bits of 2^23,
    minus 2^23 + offset (the int→float conversion it replaces issues at an eighth of the FMA
    rate, once per weight)."""
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + offset)


@triton.jit
def _i8(ptr, off, mask):
    """The int8 at byte offsets `off` as float32 (its byte XOR 128 is the value + 128)."""
    return _minus(_u8(ptr, off, mask) ^ 128, 128)


@triton.jit
def _legacy_tile(w_ptr, row, sub, m2, m3, BTYPE: tl.constexpr):
    """Q8_0 / Q4_0 / Q5_0: one block of 32 per sub-block. row (BN, 1), sub (1, SUBS)."""
    j = tl.arange(0, 32)[None, None, :]
    if BTYPE == Q8_0:  # {f16 d; i8 q[32]}: d * q
        blk = row + sub * 34
        d = _f16(w_ptr, blk, m2)
        q = _i8(w_ptr, blk[:, :, None] + 2 + j, m3)
        w = q * d[:, :, None]
    elif BTYPE == Q4_0:  # {f16 d; u8 qs[16]}: d * (nibble - 8), low nibbles first
        blk = row + sub * 18
        d = _f16(w_ptr, blk, m2)
        byte = _u8(w_ptr, blk[:, :, None] + 2 + (j % 16), m3)
        q = (byte >> ((j // 16) * 4)) & 15
        w = d[:, :, None] * _minus(q, 8)
    else:  # Q5_0 {f16 d; u32 qh; u8 qs[16]}: d * ((nibble | bit j of qh << 4) - 16)
        blk = row + sub * 22
        d = _f16(w_ptr, blk, m2)
        byte = _u8(w_ptr, blk[:, :, None] + 6 + (j % 16), m3)
        high = (_u8(w_ptr, blk[:, :, None] + 2 + j // 8, m3) >> (j % 8)) & 1
        q = ((byte >> ((j // 16) * 4)) & 15) | (high << 4)
        w = d[:, :, None] * _minus(q, 16)
    return w


@triton.jit
def _q45_k_tile(w_ptr, row, sub, m2, m3, HAS_QH: tl.constexpr):
    """Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]} and Q5_K (qh[32] before qs): sub-block
    sj of a super-block holds (d * sc[sj]) * q - dmin * m[sj], sc/m six bits each."""
    j = tl.arange(0, 32)[None, None, :]
    sj = sub % 8
    if HAS_QH:
        base = row + (sub // 8) * 176
    else:
        base = row + (sub // 8) * 144
    d = _f16(w_ptr, base, m2)
    dmin = _f16(w_ptr, base + 2, m2)
    a = _u8(w_ptr, base + 4 + sj, m2)  # scales[sj]
    b = _u8(w_ptr, base + 8 + sj, m2)  # scales[sj + 4]
    c = _u8(w_ptr, base + 4 + sj % 4, m2)  # scales[sj - 4] for sj >= 4
    low = sj < 4
    sc = tl.where(low, a & 63, (b & 15) | ((c >> 6) << 4))
    mn = tl.where(low, b & 63, (b >> 4) | ((a >> 6) << 4))
    ds = (d * _minus(sc, 0))[:, :, None]
    dm = (dmin * _minus(mn, 0))[:, :, None]
    # sub-blocks 2g and 2g + 1 are the low and high nibbles of qs[32 g : 32 g + 32]
    qs_off = (sj // 2)[:, :, None] * 32 + j
    shift = ((sj % 2) * 4)[:, :, None]
    if HAS_QH:
        q = (_u8(w_ptr, base[:, :, None] + 48 + qs_off, m3) >> shift) & 15
        high = (_u8(w_ptr, base[:, :, None] + 16 + j, m3) >> sj[:, :, None]) & 1
        q = q | (high << 4)
    else:
        q = (_u8(w_ptr, base[:, :, None] + 16 + qs_off, m3) >> shift) & 15
    return ds * _minus(q, 0) - dm


@triton.jit
def _q6_k_tile(w_ptr, row, sub, m2, m3):
    """Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: (d * sc[e // 16]) * (q - 32)."""
    j = tl.arange(0, 32)[None, None, :]
    sj = sub % 8
    base = row + (sub // 8) * 210
    d = _f16(w_ptr, base + 208, m2)
    half = (sj // 4)[:, :, None]
    quarter = (sj % 4)[:, :, None]
    ql = _u8(w_ptr, base[:, :, None] + half * 64 + (quarter % 2) * 32 + j, m3)
    qh = _u8(w_ptr, base[:, :, None] + 128 + half * 32 + j, m3)
    q = ((ql >> ((quarter // 2) * 4)) & 15) | (((qh >> (quarter * 2)) & 3) << 4)
    sc0 = _i8(w_ptr, base + 192 + sj * 2, m2)
    sc1 = _i8(w_ptr, base + 193 + sj * 2, m2)
    sc = tl.where(j < 16, (d * sc0)[:, :, None], (d * sc1)[:, :, None])
    return sc * _minus(q, 32)


@triton.jit
def gguf_tile(w_ptr, row_off, kb, k_len, mask_n, BTYPE: tl.constexpr, SUBS: tl.constexpr):
    """(BLOCK_N, SUBS, 32) float32: weights [kb * SUBS * 32, (kb + 1) * SUBS * 32) of the rows
    starting at byte offsets `row_off` (BLOCK_N,) int64; 0 where a row is masked or past
    `k_len` (a multiple of 32)."""
    sub = (kb * SUBS + tl.arange(0, SUBS))[None, :]  # (1, SUBS): sub-block of 32 in the row
    m2 = mask_n[:, None] & (sub * 32 < k_len)  # (BN, SUBS)
    m3 = m2[:, :, None]
    row = row_off[:, None]
    if BTYPE == Q4_K:
        w = _q45_k_tile(w_ptr, row, sub, m2, m3, False)
    elif BTYPE == Q5_K:
        w = _q45_k_tile(w_ptr, row, sub, m2, m3, True)
    elif BTYPE == Q6_K:
        w = _q6_k_tile(w_ptr, row, sub, m2, m3)
    else:
        w = _legacy_tile(w_ptr, row, sub, m2, m3, BTYPE)
    return w


@triton.jit
def x_chunk(x_row_ptr, kb, k_len, SUBS: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_N, SUBS, 32) float32 activations matching `gguf_tile`'s chunk kb (0 past k_len),
    the same for every row: loaded at the tile's full shape, so each thread loads the
    activations of the weights it holds (repeats hit L1). A (SUBS, 32) load broadcast over
    the rows was redistributed through shared memory with 8 barriers an iteration in the
    Q4_K GEMV and cost Q8_0 twice the loads (bench/sass_report.py)."""
    ks = kb * SUBS * 32 + tl.arange(0, SUBS)[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    ks = ks + tl.zeros((BLOCK_N, 1, 1), tl.int32)
    return tl.load(x_row_ptr + ks, mask=ks < k_len, other=0.0).to(tl.float32)
