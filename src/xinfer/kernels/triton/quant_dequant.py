"""Weight-tile loaders of the quantized formats (jit helpers of `quant_gemm.py`): each
reads a (BLOCK_N, BLOCK_K) tile of a weight (N, K) in its stored bytes and returns it
dequantized in float32, computed as the format's twin computes it (so the twin's bits).

Pointers: `w` the packed weight; `s` the scales; `z` the third tensor (int4 zero codes, NVFP4
per-row global scales; unused otherwise). Rows `offs_n` and absolute columns `offs_k`.
FMT: 1 = FP8 block (e4m3 x float32 scale per SCALE_BN x SCALE_BK block); 2 = int4 grouped
((code - zero) x scale per SCALE_BK columns, zero 8 without zeros); 3 = NVFP4 (e2m1 x e4m3
scale per 16 columns x float32 per-row global)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _e2m1(code):
    """e2m1 code 0..15 → value (bit 3 the sign): 0, 0.5, 1, 1.5, 2, 3, 4, 6."""
    mag = code & 7
    e = mag >> 1
    m = (mag & 1).to(tl.float32)
    pow2 = tl.where(e == 3, 4.0, tl.where(e == 2, 2.0, 1.0))  # 2^(e-1) for e >= 1
    v = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * pow2)
    return tl.where(code >= 8, -v, v)


@triton.jit
def _nibble(w_ptr, offs_n, offs_k, mask, stride_wn):
    byte = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] // 2, mask=mask, other=0)
    return (byte.to(tl.int32) >> ((offs_k[None, :] & 1) * 4)) & 15


@triton.jit
def load_weight_tile(
    w_ptr, s_ptr, z_ptr, offs_n, offs_k, mask_n, mask_k,
    stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
):  # fmt: skip
    """(BLOCK_N, BLOCK_K) float32 tile; masked elements are 0."""
    rows = offs_n[:, None]
    mask = mask_n[:, None] & mask_k[None, :]
    if FMT == 1:
        q = tl.load(w_ptr + rows * stride_wn + offs_k[None, :], mask=mask, other=0.0)
        s_offs = (rows // SCALE_BN) * stride_sn + offs_k[None, :] // SCALE_BK
        s = tl.load(s_ptr + s_offs, mask=mask, other=0.0)
        w = q.to(tl.float32) * s
    elif FMT == 2:
        code = _nibble(w_ptr, offs_n, offs_k, mask, stride_wn).to(tl.float32)
        g = offs_k[None, :] // SCALE_BK
        s = tl.load(s_ptr + rows * stride_sn + g, mask=mask, other=0.0).to(tl.float32)
        if HAS_ZERO:
            z = tl.load(z_ptr + rows * stride_zn + g, mask=mask, other=0).to(tl.float32)
        else:
            z = 8.0
        w = (code - z) * s
    else:
        v = _e2m1(_nibble(w_ptr, offs_n, offs_k, mask, stride_wn))
        s = tl.load(s_ptr + rows * stride_sn + offs_k[None, :] // 16, mask=mask, other=0.0)
        s2 = tl.load(z_ptr + offs_n * stride_zn, mask=mask_n, other=0.0)
        w = v * (s.to(tl.float32) * s2[:, None])
    return w


@triton.jit
def load_weight_pairs(
    w_ptr, s_ptr, z_ptr, offs_n, offs_p, mask_n, mask_p,
    stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
):  # fmt: skip
    """4-bit formats (FMT 2, 3) by whole bytes: `offs_p` are byte columns (k = 2p, 2p + 1);
    returns the (BLOCK_N, BLOCK_P) float32 tiles of the even and the odd columns. Contiguous
    byte loads, and the twin's arithmetic per element."""
    rows = offs_n[:, None]
    mask = mask_n[:, None] & mask_p[None, :]
    byte = tl.load(w_ptr + rows * stride_wn + offs_p[None, :], mask=mask, other=0).to(tl.int32)
    lo_code = byte & 15
    hi_code = byte >> 4
    if FMT == 2:
        g = (2 * offs_p[None, :]) // SCALE_BK  # both columns of a byte share a group
        s = tl.load(s_ptr + rows * stride_sn + g, mask=mask, other=0.0).to(tl.float32)
        if HAS_ZERO:
            z = tl.load(z_ptr + rows * stride_zn + g, mask=mask, other=0).to(tl.float32)
        else:
            z = 8.0
        lo = (lo_code.to(tl.float32) - z) * s
        hi = (hi_code.to(tl.float32) - z) * s
    else:
        s = tl.load(s_ptr + rows * stride_sn + offs_p[None, :] // 8, mask=mask, other=0.0)
        s2 = tl.load(z_ptr + offs_n * stride_zn, mask=mask_n, other=0.0)
        scale = s.to(tl.float32) * s2[:, None]
        lo = _e2m1(lo_code) * scale
        hi = _e2m1(hi_code) * scale
    return lo, hi
