"""Weight-tile loaders of the quantized formats (jit helpers of `quant_gemm.py`): each
reads the columns [k0, k0 + BLOCK_K) of rows `offs_n` of a weight (N, K) in its stored
bytes and returns them dequantized in float32, computed as the format's twin computes them
(so the twin's bits).

Scales are loaded once per (row, scale group) of a tile, not once per element: a tile is
read as (BLOCK_N, BLOCK_K // GROUP_T, GROUP_T) where GROUP_T columns share one scale (the
launcher picks GROUP_T = min(columns per scale, BLOCK_K), or 1 where a tile could straddle
a group) and the scale tile (BLOCK_N, BLOCK_K // GROUP_T) is broadcast over each group. A
per-element gather of the scales cost as many load instructions as the weight bytes.

Pointers: `w` the packed weight; `s` the scales; `z` the third tensor (int4 zero codes, NVFP4
per-row global scales; unused otherwise).
FMT: 1 = FP8 block (e4m3 x float32 scale per SCALE_BN x SCALE_BK block); 2 = int4 grouped
((code - zero) x scale per SCALE_BK columns, zero 8 without zeros); 3 = NVFP4 (e2m1 x e4m3
scale per 16 columns x float32 per-row global)."""

from __future__ import annotations

import triton
import triton.language as tl

# (module constants a jit function reads must be tl.constexpr objects: compiled Triton
# refuses any other global, though the CPU interpreter allows it)
E2M1_UNSCALE = tl.constexpr(16384.0)  # 2^14: what `_e2m1_scaled` leaves in the scales
INT4_MAGIC = tl.constexpr(0x4B000000)  # the bits of 2^23: OR a code < 2^23 in, get 2^23 + code


@triton.jit
def _e2m1_scaled(code):
    """e2m1 code 0..15 (bit 3 the sign) → its value (0, 0.5, 1, 1.5, 2, 3, 4, 6) times 2^-14,
    exactly: the three magnitude bits placed at bits 9-11 of an fp16 are its exponent and top
    mantissa bit (e = 0 a subnormal), so shifts and one conversion replace the arithmetic and
    the int→float conversion. The 2^14 is folded into the scales (`_group_scales`): scaling
    by a power of two is exact, so w = (v·2^-14)·(s·2^14) has the bits of v·s."""
    bits = ((code & 8) << 12) | ((code & 7) << 9)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _int4_minus(code, z):
    """code - z in float32, exactly, for codes 0..15 and integer zeros z: 2^23 + code by
    OR-ing the code into the bits of 2^23, minus 2^23 + z (the int→float conversion it
    replaces issues at an eighth of the FMA rate)."""
    return (code | INT4_MAGIC).to(tl.float32, bitcast=True) - (z + 8388608.0)


@triton.jit
def _group_scales(
    s_ptr, z_ptr, offs_n, k0, mask_n, k_dim, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr,
):  # fmt: skip
    """(scale, zero) of each (row, column group) of the tile, (BLOCK_N, BLOCK_K // GROUP_T)
    float32: FP8 its block scale (zero unused), int4 scale and zero code, NVFP4 the e4m3
    scale times the row's global scale times 2^14 (zero unused; see `_e2m1_scaled`)."""
    first = k0 + tl.arange(0, BLOCK_K // GROUP_T) * GROUP_T  # first column of each group
    mask = mask_n[:, None] & (first < k_dim)[None, :]
    if FMT == 1:
        offs = (offs_n // SCALE_BN)[:, None] * stride_sn + (first // SCALE_BK)[None, :]
        s = tl.load(s_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        z = s
    elif FMT == 2:
        offs = offs_n[:, None] * stride_sn + (first // SCALE_BK)[None, :]
        s = tl.load(s_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_ZERO:
            zo = offs_n[:, None] * stride_zn + (first // SCALE_BK)[None, :]
            z = tl.load(z_ptr + zo, mask=mask, other=0).to(tl.float32)
        else:
            z = tl.full(s.shape, 8.0, tl.float32)
    else:
        offs = offs_n[:, None] * stride_sn + (first // 16)[None, :]
        s = tl.load(s_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(z_ptr + offs_n * stride_zn, mask=mask_n, other=0.0)
        s = s * s2[:, None] * E2M1_UNSCALE  # (the last factor exact: see `_e2m1_scaled`)
        z = s
    return s, z


@triton.jit
def load_raw_tile3(
    w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim,
    stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr, EVEN: tl.constexpr = False,
):  # fmt: skip
    """(codes' values (BLOCK_N, BLOCK_K // GROUP_T, GROUP_T), their scales (BLOCK_N,
    BLOCK_K // GROUP_T)) float32 of columns k0 .. k0 + BLOCK_K: the weight is value × scale
    (FP8: e4m3 value; int4: code − zero; NVFP4: e2m1 value × 2^-14). Masked elements (rows
    past N, columns past K) have scale 0. EVEN: every row and column of the tile exists (N
    and the K range whole tiles: the launcher checks), the FP8 codes load unmasked."""
    if FMT == 1:
        g = tl.arange(0, BLOCK_K // GROUP_T)
        cols = k0 + g[:, None] * GROUP_T + tl.arange(0, GROUP_T)[None, :]  # (G, GROUP_T)
        rows = offs_n[:, None, None]
        mask = mask_n[:, None, None] & (cols < k_dim)[None, :, :]
        s, z = _group_scales(
            s_ptr, z_ptr, offs_n, k0, mask_n, k_dim, stride_sn, stride_zn,
            FMT, SCALE_BN, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
        )  # fmt: skip
        if EVEN:
            q = tl.load(w_ptr + rows * stride_wn + cols[None, :, :])
        else:
            q = tl.load(w_ptr + rows * stride_wn + cols[None, :, :], mask=mask, other=0.0)
        v = q.to(tl.float32)
    else:
        # 4-bit codes: whole bytes, contiguous (one load a byte, not one a column), their two
        # nibbles joined back into column order (GROUP_T is even for these formats). (An
        # `else`, not code after a return in the FP8 branch: compiled Triton builds that code
        # for FP8 too, and its byte load cannot take an e4m3 pointer.)
        lo, hi, s = load_raw_pairs(
            w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim, stride_wn, stride_sn, stride_zn,
            FMT, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
        )  # fmt: skip
        v = tl.reshape(tl.join(lo, hi), (offs_n.shape[0], BLOCK_K // GROUP_T, GROUP_T))
    return v, s


@triton.jit
def load_weight_tile3(
    w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim,
    stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr,
):  # fmt: skip
    """(BLOCK_N, BLOCK_K // GROUP_T, GROUP_T) float32 tile of columns k0 .. k0 + BLOCK_K;
    masked elements (rows past N, columns past K) are 0."""
    v, s = load_raw_tile3(
        w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim, stride_wn, stride_sn, stride_zn,
        FMT, SCALE_BN, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
    )  # fmt: skip
    return v * s[:, :, None]


@triton.jit
def load_weight_tile(
    w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim,
    stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr,
):  # fmt: skip
    """`load_weight_tile3` as a (BLOCK_N, BLOCK_K) float32 tile (for `tl.dot`)."""
    w = load_weight_tile3(
        w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim, stride_wn, stride_sn, stride_zn,
        FMT, SCALE_BN, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
    )  # fmt: skip
    return tl.reshape(w, (offs_n.shape[0], BLOCK_K))


@triton.jit
def load_raw_pairs(
    w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim,
    stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr,
):  # fmt: skip
    """4-bit formats (FMT 2, 3) by whole bytes: the bytes of columns k0 .. k0 + BLOCK_K as
    (BLOCK_N, BLOCK_K // GROUP_T, GROUP_T // 2) byte columns (byte p holds columns 2p and
    2p + 1); returns the codes' values of the even and the odd columns (as
    `load_raw_tile3`) and the scales (BLOCK_N, BLOCK_K // GROUP_T); masked: scale 0."""
    g = tl.arange(0, BLOCK_K // GROUP_T)
    bcols = k0 // 2 + g[:, None] * (GROUP_T // 2) + tl.arange(0, GROUP_T // 2)[None, :]
    rows = offs_n[:, None, None]
    mask = mask_n[:, None, None] & (2 * bcols < k_dim)[None, :, :]
    byte = tl.load(w_ptr + rows * stride_wn + bcols[None, :, :], mask=mask, other=0)
    byte = byte.to(tl.int32)
    s, z = _group_scales(
        s_ptr, z_ptr, offs_n, k0, mask_n, k_dim, stride_sn, stride_zn,
        FMT, 1, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
    )  # fmt: skip
    lo_code = byte & 15
    hi_code = byte >> 4
    if FMT == 2:
        lo = _int4_minus(lo_code, z[:, :, None])
        hi = _int4_minus(hi_code, z[:, :, None])
    else:
        lo = _e2m1_scaled(lo_code)
        hi = _e2m1_scaled(hi_code)
    return lo, hi, s


@triton.jit
def _e2m1_pair_bits(v):
    """The fp16 bits (as `_e2m1_scaled` places them) of the e2m1 codes in bits 0-3 and 16-19
    of each int32 of `v`, in the low and high halves: one shift pair and one LOP3 for two."""
    return ((v << 12) & -0x7FFF8000) | ((v << 9) & 0x0E000E00)  # (0x80008000 as an int32)


@triton.jit
def _half_lo(bits):
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _half_hi(bits):
    return (bits >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _sub_f16x2(a, b):
    """The two fp16 halves of int32 words a less those of b (`sub.f16x2`: one instruction for
    two codes; exact for the int4 decode, whose halves are 1024 + code and 1024 + zero)."""
    return tl.inline_asm_elementwise(
        "sub.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1
    )


@triton.jit
def load_raw_words(
    w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim,
    stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr, EVEN: tl.constexpr = False,
    WORD_VEC: tl.constexpr = 1, HALF2: tl.constexpr = False,
):  # fmt: skip
    """4-bit formats (FMT 2, 3) by 32-bit words of 8 codes (GROUP_T a multiple of 8, rows and
    `w_ptr` 4-byte aligned: the launcher checks): the codes' values (BLOCK_N, BLOCK_K //
    GROUP_T, GROUP_T) in column order and the scales, as `load_raw_tile3`. Nibble k and
    k + 4 of a word sit at bits 4k and 4k + 16, one per 16-bit half, so one shift, mask and
    or decode two codes into fp16 bits (NVFP4: `_e2m1_scaled`'s bits; int4: 1024 + code,
    exact, less 1024 + zero in float32, or with HALF2 both halves at once by `sub.f16x2`:
    the same values), and joins put the eight back in column order (this tile feeds no
    `tl.dot`; see `turbo_kv_rows` for joins before dots under Triton 3.6). EVEN: as
    `load_raw_tile3`'s, the words load unmasked. WORD_VEC: words a thread loads at once."""
    G: tl.constexpr = BLOCK_K // GROUP_T
    NW: tl.constexpr = GROUP_T // 8
    g = tl.arange(0, G)
    wcols = k0 // 8 + g[:, None] * NW + tl.arange(0, NW)[None, :]  # words of the row
    mask = mask_n[:, None, None] & (8 * wcols < k_dim)[None, :, :]
    wp = w_ptr.to(tl.pointer_type(tl.int32))
    woffs = offs_n[:, None, None] * (stride_wn // 4) + wcols[None, :, :]
    # WORD_VEC words a thread (1: the eight values of a word lie in one thread as the
    # activations' 16-byte loads do, so the product needs no layout conversion; 4, the MoE
    # GEMV's: 16-byte loads, x converted once a program; the launcher checks the alignment)
    woffs = tl.max_contiguous(tl.multiple_of(woffs, [1, 1, WORD_VEC]), [1, 1, WORD_VEC])
    if EVEN:
        word = tl.load(wp + woffs)
    else:
        word = tl.load(wp + woffs, mask=mask, other=0)
    s, z = _group_scales(
        s_ptr, z_ptr, offs_n, k0, mask_n, k_dim, stride_sn, stride_zn,
        FMT, 1, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
    )  # fmt: skip
    if FMT == 2 and HALF2:
        zz = ((z.to(tl.int32) + 0x6400) * 0x00010001)[:, :, None]
        b0 = _sub_f16x2((word & 0x000F000F) | 0x64006400, zz)
        b1 = _sub_f16x2(((word >> 4) & 0x000F000F) | 0x64006400, zz)
        b2 = _sub_f16x2(((word >> 8) & 0x000F000F) | 0x64006400, zz)
        b3 = _sub_f16x2(((word >> 12) & 0x000F000F) | 0x64006400, zz)
        x0 = tl.join(_half_lo(b0), _half_hi(b0))
        x1 = tl.join(_half_lo(b1), _half_hi(b1))
        x2 = tl.join(_half_lo(b2), _half_hi(b2))
        x3 = tl.join(_half_lo(b3), _half_hi(b3))
    elif FMT == 2:
        off = (z + 1024.0)[:, :, None]
        b0 = (word & 0x000F000F) | 0x64006400
        b1 = ((word >> 4) & 0x000F000F) | 0x64006400
        b2 = ((word >> 8) & 0x000F000F) | 0x64006400
        b3 = ((word >> 12) & 0x000F000F) | 0x64006400
        x0 = tl.join(_half_lo(b0) - off, _half_hi(b0) - off)
        x1 = tl.join(_half_lo(b1) - off, _half_hi(b1) - off)
        x2 = tl.join(_half_lo(b2) - off, _half_hi(b2) - off)
        x3 = tl.join(_half_lo(b3) - off, _half_hi(b3) - off)
    else:
        b0 = _e2m1_pair_bits(word)
        b1 = _e2m1_pair_bits(word >> 4)
        b2 = _e2m1_pair_bits(word >> 8)
        b3 = _e2m1_pair_bits(word >> 12)
        x0 = tl.join(_half_lo(b0), _half_hi(b0))
        x1 = tl.join(_half_lo(b1), _half_hi(b1))
        x2 = tl.join(_half_lo(b2), _half_hi(b2))
        x3 = tl.join(_half_lo(b3), _half_hi(b3))
    # x_k (.., 2): columns k and k + 4 of each word; joined to (.., h, k1, k0), k = 2 k1 + k0
    v = tl.join(tl.join(x0, x2), tl.join(x1, x3))
    return tl.reshape(v, (offs_n.shape[0], G, GROUP_T)), s


@triton.jit
def load_weight_pairs(
    w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim,
    stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr,
):  # fmt: skip
    """`load_raw_pairs` scaled: the float32 weights of the even and the odd columns, each
    element as the twin computes it."""
    lo, hi, s = load_raw_pairs(
        w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim, stride_wn, stride_sn, stride_zn,
        FMT, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
    )  # fmt: skip
    return lo * s[:, :, None], hi * s[:, :, None]
