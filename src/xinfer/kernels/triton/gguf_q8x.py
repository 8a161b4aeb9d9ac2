"""GGUF Q4_K expert GEMVs on int8 activations (launched from `kernels/gguf_q8x_launch.py`):
the activations are quantized per block of 32 to int8 with one float32 scale (ggml's q8_1
idea: d = amax / 127, q = round(x / d), and d·Σq kept for the minimum term), packed four to
a 32-bit word; a weight word holds eight 4-bit codes, the low nibbles of four bytes for one
sub-block and the high nibbles for the next, so one AND (and a shift) gives four codes
ready for one `dp4a` (four int8 products summed into an int32) against one word of x.
Per 256 weights of a row: 32 words of codes, 64 `dp4a`, and the float work once per
sub-block of 32 — d·sc·dx·Σ(q·xq) − dmin·m·dx·Σxq — where the float GEMVs
(`gguf_gemm.py`) dequantize and multiply every weight (~11 instructions a weight a thread
in the Q4_K MoE GEMV's loop, bench/sass_report.py).

Exact integer sums: `dp4a` runs as PTX inline assembly on the GPU (`ASM`), and as shifts
and multiplies in Triton's CPU interpreter (which has no inline assembly) with the same
int32 result. The quantization divides with `div_rn` (IEEE division, not the approximate
`/`), so its int8 codes and scales are the twin's (`kernels/gguf_q8x_reference.py`) bit for
bit. A row's result depends on its own activations only: batch-invariant."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.fused_moe import _silu_mul, combine_when_last

ROUND = tl.constexpr(12582912.0)  # 1.5 * 2^23: (v + ROUND) - ROUND rounds |v| < 2^22 to even


@triton.jit
def _sbyte(v, shift: tl.constexpr):
    """The signed byte at bit `shift` of int32 words `v`, as int32."""
    return (v << (24 - shift)) >> 24


@triton.jit
def dp4a(a, b, ASM: tl.constexpr):
    """Σ_i a.byte[i] · b.byte[i] over the four signed bytes of int32 words a and b."""
    if ASM:
        return tl.inline_asm_elementwise(
            "dp4a.s32.s32 $0, $1, $2, 0;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
            pack=1,
        )  # fmt: skip
    else:
        return (
            _sbyte(a, 0) * _sbyte(b, 0) + _sbyte(a, 8) * _sbyte(b, 8)
            + _sbyte(a, 16) * _sbyte(b, 16) + _sbyte(a, 24) * _sbyte(b, 24)
        )  # fmt: skip


@triton.jit
def quantize_blocks(v, S: tl.constexpr):
    """v (S, 32) float32 → (words (S, 8) int32: the int8 codes four a word, lowest byte
    first; d (S,) float32; d·Σq (S,) float32). d = amax / 127, q = round-half-even(v / d)
    (0 where the block is all zeros)."""
    d = tl.math.div_rn(tl.max(tl.abs(v), axis=1), 127.0)
    safe = tl.where(d > 0, d, 1.0)
    r = tl.math.div_rn(v, safe[:, None])
    q = tl.where(d[:, None] > 0, (r + ROUND) - ROUND, 0.0).to(tl.int32)
    shifts = (tl.arange(0, 4) * 8)[None, None, :]
    words = tl.sum((tl.reshape(q, (S, 8, 4)) & 255) << shifts, axis=2)
    return words, d, d * tl.sum(q, axis=1).to(tl.float32)


@triton.jit
def quantize_q8x_kernel(
    x_ptr, xw_ptr, xd_ptr, xs_ptr, K, stride_xm, stride_wm, stride_dm, S: tl.constexpr,
):  # fmt: skip
    """grid (M, cdiv(K, S * 32)): row m's blocks of 32 → xw[m] (K/4 words), xd[m] and
    xs[m] (K/32 each: d and d·Σq). K is a multiple of 32."""
    m = tl.program_id(0).to(tl.int64)
    b0 = tl.program_id(1) * S
    blocks = b0 + tl.arange(0, S)
    ks = blocks[:, None] * 32 + tl.arange(0, 32)[None, :]
    live = blocks * 32 < K
    v = tl.load(x_ptr + m * stride_xm + ks, mask=live[:, None], other=0.0).to(tl.float32)
    words, d, s = quantize_blocks(v, S)
    wo = blocks[:, None] * 8 + tl.arange(0, 8)[None, :]
    tl.store(xw_ptr + m * stride_wm + wo, words, mask=live[:, None])
    tl.store(xd_ptr + m * stride_dm + blocks, d, mask=live)
    tl.store(xs_ptr + m * stride_dm + blocks, s, mask=live)


@triton.jit
def _f16_bits(bits):
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def q4k_dot(w8_ptr, w32_ptr, row_word, sb, xw_ptr, xd_ptr, xs_ptr, mask_n, ASM: tl.constexpr):
    """(BLOCK_N,) float32: super-block `sb` (256 weights, 144 bytes = 36 words) of the Q4_K
    rows starting at int32 word offsets `row_word` against one quantized activation row
    (xw, xd, xs at its start). Q4_K: {f16 d, dmin; u8 scales[12]; u8 qs[128]}; qs[32 j + l]
    holds weight 64 j + l (low nibble) and 64 j + 32 + l (high); sub-block s weighs
    d·sc[s]·q − dmin·m[s], sc and m six bits each."""
    base = row_word + sb * 36
    j = tl.arange(0, 4)
    t = tl.arange(0, 8)
    codes = tl.load(
        w32_ptr + base[:, None, None] + 4 + (j * 8)[None, :, None] + t[None, None, :],
        mask=mask_n[:, None, None], other=0,
    )  # fmt: skip
    xo = sb * 64 + (j * 16)[:, None] + t[None, :]  # sub-block 2j: words 16j + t; 2j+1: +8
    lo = tl.sum(dp4a(codes & 0x0F0F0F0F, tl.load(xw_ptr + xo)[None], ASM), axis=2)
    hi = tl.sum(dp4a((codes >> 4) & 0x0F0F0F0F, tl.load(xw_ptr + xo + 8)[None], ASM), axis=2)
    isum = tl.reshape(tl.join(lo, hi), (lo.shape[0], 8)).to(tl.float32)  # (BN, 8) by s
    dm = tl.load(w32_ptr + base, mask=mask_n, other=0)
    d = _f16_bits(dm & 0xFFFF)
    dmin = _f16_bits((dm >> 16) & 0xFFFF)
    s = tl.arange(0, 8)[None, :]
    byte = (base * 4)[:, None] + 4
    m2 = mask_n[:, None]
    a = tl.load(w8_ptr + byte + s, mask=m2, other=0).to(tl.int32)  # scales[s]
    b = tl.load(w8_ptr + byte + 4 + s % 4 + 4 * (s // 4), mask=m2, other=0).to(tl.int32)
    c = tl.load(w8_ptr + byte + s % 4, mask=m2, other=0).to(tl.int32)  # scales[s - 4]
    low = s < 4
    sc = tl.where(low, a & 63, (b & 15) | ((c >> 6) << 4)).to(tl.float32)
    mn = tl.where(low, b & 63, (b >> 4) | ((a >> 6) << 4)).to(tl.float32)
    dx = tl.load(xd_ptr + sb * 8 + s)
    sx = tl.load(xs_ptr + sb * 8 + s)
    part = d[:, None] * (sc * (dx * isum)) - dmin[:, None] * (mn * sx)
    return tl.sum(part, axis=1)


@triton.jit
def q4k_moe_gate_up_q8x_kernel(
    xw_ptr, xd_ptr, xs_ptr, ids_ptr, w8_ptr, w32_ptr, iw_ptr, id_ptr, is_ptr,
    hidden_dim, inter_dim,
    stride_xw, stride_xd, stride_we, stride_wn, stride_iw, stride_id,
    TOP_K: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """grid (T*k, I / 32): h = silu(x·W13[e, n]) * (x·W13[e, I + n]) for one block of 32
    columns n, written quantized for the down GEMV (iw, id, is as `quantize_q8x_kernel`).
    Strides of w in int32 words."""
    pair = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    tok = pair // TOP_K
    e = tl.load(ids_ptr + pair).to(tl.int64)
    offs_n = blk * 32 + tl.arange(0, 32)
    mask_n = offs_n < inter_dim
    gate = e * stride_we + offs_n.to(tl.int64) * stride_wn
    up = gate + inter_dim * stride_wn
    xw, xd, xs = xw_ptr + tok * stride_xw, xd_ptr + tok * stride_xd, xs_ptr + tok * stride_xd
    g = tl.zeros((32,), dtype=tl.float32)
    u = tl.zeros((32,), dtype=tl.float32)
    for sb in range(0, hidden_dim // 256):
        g += q4k_dot(w8_ptr, w32_ptr, gate, sb, xw, xd, xs, mask_n, ASM)
        u += q4k_dot(w8_ptr, w32_ptr, up, sb, xw, xd, xs, mask_n, ASM)
    h = _silu_mul(g, u, tl.float32)
    words, d, s = quantize_blocks(tl.reshape(h, (1, 32)), 1)
    tl.store(iw_ptr + pair * stride_iw + blk * 8 + tl.arange(0, 8), tl.reshape(words, (8,)))
    tl.store(id_ptr + pair * stride_id + blk + tl.arange(0, 1), d)
    tl.store(is_ptr + pair * stride_id + blk + tl.arange(0, 1), s)


@triton.jit
def q4k_moe_down_q8x_kernel(
    iw_ptr, id_ptr, is_ptr, ids_ptr, w8_ptr, w32_ptr, y_ptr, weights_ptr, out_ptr, count_ptr,
    hidden_dim, inter_dim,
    stride_iw, stride_id, stride_we, stride_wn, stride_yt, stride_ot,
    BLOCK_N: tl.constexpr, TOP_K: tl.constexpr, COMBINE: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """grid (T*k, cdiv(H, BLOCK_N)): y[pair, n] = inter[pair]·W2[e, n] on the quantized
    inter, rounded to y's dtype; with COMBINE the last of a token's programs sums its pairs
    (`combine_when_last`), as the float down GEMVs do."""
    pair = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hidden_dim
    rows = e * stride_we + offs_n.to(tl.int64) * stride_wn
    iw, idd, iss = iw_ptr + pair * stride_iw, id_ptr + pair * stride_id, is_ptr + pair * stride_id
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for sb in range(0, inter_dim // 256):
        acc += q4k_dot(w8_ptr, w32_ptr, rows, sb, iw, idd, iss, mask_n, ASM)
    y = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + pair * stride_yt + offs_n, y, mask=mask_n)
    if COMBINE:
        combine_when_last(
            y_ptr, weights_ptr, out_ptr, count_ptr, pair, pid_n, tl.num_programs(1), offs_n,
            mask_n, stride_yt, stride_ot, TOP_K,
        )  # fmt: skip
