"""GGUF Q4_K decode GEMVs on int8 activations (launched from `kernels/gguf_q8x_launch.py`):
the routed-expert MLP and the linear. Each program quantizes the activations it reads per
block of 32 to int8 with one float32 scale (ggml's q8_1 idea: d = amax / 127, q = round(x
· (1 / d)), d·Σq kept for the minimum term), packed four to a 32-bit word — no launch of
its own: a 2048-wide row costs each program a few hundred instructions. A weight word holds
eight 4-bit codes, the low nibbles of four bytes for one sub-block and the high nibbles for
the next, so one AND (and a shift) gives four codes ready for one `dp4a` (four int8
products summed into an int32) against one word of x. Per 256 weights of a row: 32 words of
codes, 64 `dp4a`, and the float work once per sub-block of 32 — d·sc·dx·Σ(q·xq) −
dmin·mn·dx·Σxq — where the float GEMVs (`gguf_gemm.py`) dequantize and multiply every
weight (~11 instructions a weight a thread in the Q4_K MoE GEMV's loop,
bench/sass_report.py).

Exact integer sums: `dp4a` runs as PTX inline assembly on the GPU (`ASM`), and as shifts
and multiplies in Triton's CPU interpreter (which has no inline assembly) with the same
int32 result. The quantization divides with `div_rn` and multiplies with `mul.rn` (never
fused into an FMA), so its int8 codes and scales are the twin's
(`kernels/gguf_q8x_reference.py`) bit for bit. A row's result depends on its own
activations only: batch-invariant, and the same in whatever slot its expert sits."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.fused_moe import _silu_mul, combine_when_last
from xinfer.kernels.triton.gemv import store_split_tile

Q8_0 = tl.constexpr(8)  # ggml type ids, as `gguf_dequant`
Q4_K = tl.constexpr(12)
Q6_K = tl.constexpr(14)
ROUND = tl.constexpr(12582912.0)  # 1.5 * 2^23: v + ROUND holds round-half-even(v) in its low
# mantissa bits for |v| < 2^22 (bits − 0x4B400000 = the integer)


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
def _mul_rn(a, b, ASM: tl.constexpr):
    """a * b rounded once (`mul.rn`: never fused with a following add into an FMA, which
    would round differently from the twin's separate multiply)."""
    if ASM:
        return tl.inline_asm_elementwise(
            "mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return a * b


@triton.jit
def quantize_blocks(v, ASM: tl.constexpr):
    """v (S, 32) float32 → (words (S, 8) int32: the int8 codes four a word, lowest byte
    first; d (S,); d·Σq (S,) float32): d = amax / 127, q = round-half-even(v · (1 / d)),
    0 where a block is all zeros (the twin: `gguf_q8x_reference.quantize_codes`)."""
    d = tl.math.div_rn(tl.max(tl.abs(v), axis=1), 127.0)
    inv = tl.where(d > 0, tl.math.div_rn(1.0, tl.where(d > 0, d, 1.0)), 0.0)
    r = _mul_rn(v, inv[:, None], ASM) + ROUND  # the integer in the low bits, rounded to even
    q = r.to(tl.int32, bitcast=True) - 0x4B400000
    shifts = (tl.arange(0, 4) * 8)[None, None, :]
    words = tl.sum((tl.reshape(q, (v.shape[0], 8, 4)) & 255) << shifts, axis=2)
    return words, d, d * tl.sum(q, axis=1).to(tl.float32)


@triton.jit
def _f16_bits(bits):
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _scale_min(w8_ptr, byte, s, m2):
    """(sc, mn) float32 of sub-blocks `s` of the super-blocks whose 12 scale bytes start at
    byte offsets `byte`: six bits each, the high two of sub-blocks 4-7 in bytes 0-7."""
    a = tl.load(w8_ptr + byte + s, mask=m2, other=0).to(tl.int32)  # scales[s]
    b = tl.load(w8_ptr + byte + 4 + s, mask=m2, other=0).to(tl.int32)  # scales[s + 4]
    c = tl.load(w8_ptr + byte + s % 4, mask=m2, other=0).to(tl.int32)  # scales[s - 4]
    low = s < 4
    sc = tl.where(low, a & 63, (b & 15) | ((c >> 6) << 4))
    mn = tl.where(low, b & 63, (b >> 4) | ((a >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _x_layout(sb, Q4K: tl.constexpr):
    """Activation offsets (4, 32) of the "lo" blocks of super-step `sb` (256 values) and the
    offset of the "hi" ones after them: Q4_K pairs sub-blocks 2j and 2j + 1 (the low and
    high nibbles of one weight word), Q8_0 and Q6_K blocks j and j + 4."""
    j = tl.arange(0, 4)
    if Q4K:
        return sb * 256 + (j * 64)[:, None] + tl.arange(0, 32)[None, :], 32
    else:
        return sb * 256 + (j * 32)[:, None] + tl.arange(0, 32)[None, :], 128


@triton.jit
def x_quantized(x_row_ptr, sb, K, Q4K: tl.constexpr, ASM: tl.constexpr):
    """Super-step `sb` (256 values) of one activation row (float) of K, quantized here
    (`quantize_blocks`): (words (4, 8) lo, words hi, d lo (4,), d hi, d·Σq lo, d·Σq hi).
    Q4_K rows are whole steps; Q8_0's may end inside one (K a multiple of 32): the blocks
    past K are zeros (d = 0)."""
    ks, hi = _x_layout(sb, Q4K)
    if Q4K:
        x_lo = tl.load(x_row_ptr + ks)
        x_hi = tl.load(x_row_ptr + ks + hi)
    else:
        x_lo = tl.load(x_row_ptr + ks, mask=ks < K, other=0.0)
        x_hi = tl.load(x_row_ptr + ks + hi, mask=ks + hi < K, other=0.0)
    w_lo, d_lo, s_lo = quantize_blocks(x_lo.to(tl.float32), ASM)
    w_hi, d_hi, s_hi = quantize_blocks(x_hi.to(tl.float32), ASM)
    return w_lo, w_hi, d_lo, d_hi, s_lo, s_hi


@triton.jit
def x_loaded(xw_ptr, xd_ptr, xs_ptr, sb, nblk, Q4K: tl.constexpr):
    """`x_quantized`'s values read from a row of `nblk` blocks quantized before (words of
    block b at [8 b, 8 b + 8), its d and d·Σq at [b]); zeros past the row."""
    j = tl.arange(0, 4)
    if Q4K:
        b = sb * 8 + j * 2
        step = 1
    else:
        b = sb * 8 + j
        step = 4
    b2 = b + step
    xo = (b * 8)[:, None] + tl.arange(0, 8)[None, :]
    m, m2 = b < nblk, b2 < nblk
    return (
        tl.load(xw_ptr + xo, mask=m[:, None], other=0),
        tl.load(xw_ptr + xo + step * 8, mask=m2[:, None], other=0),
        tl.load(xd_ptr + b, mask=m, other=0.0), tl.load(xd_ptr + b2, mask=m2, other=0.0),
        tl.load(xs_ptr + b, mask=m, other=0.0), tl.load(xs_ptr + b2, mask=m2, other=0.0),
    )  # fmt: skip


@triton.jit
def q4k_dot(
    w8_ptr, w32_ptr, row_word, sb, xw_lo, xw_hi, dx_lo, dx_hi, sx_lo, sx_hi, mask_n,
    ASM: tl.constexpr,
):  # fmt: skip
    """(BLOCK_N,) float32: super-block `sb` (256 weights, 144 bytes = 36 words) of the Q4_K
    rows starting at int32 word offsets `row_word` against one quantized activation
    super-block (`x_quantized` / `x_loaded`). Q4_K: {f16 d, dmin; u8 scales[12]; u8
    qs[128]}; qs[32 j + l] holds weight 64 j + l in its low nibble and 64 j + 32 + l in its
    high one; sub-block s weighs d·sc[s]·q − dmin·mn[s]. The even and odd sub-blocks go
    apart so that no tensor is reshaped."""
    j = tl.arange(0, 4)
    base = row_word + sb * 36
    t = tl.arange(0, 8)
    codes = tl.load(
        w32_ptr + base[:, None, None] + 4 + (j * 8)[None, :, None] + t[None, None, :],
        mask=mask_n[:, None, None], other=0,
    )  # fmt: skip
    i_lo = tl.sum(dp4a(codes & 0x0F0F0F0F, xw_lo[None], ASM), axis=2).to(tl.float32)
    i_hi = tl.sum(dp4a((codes >> 4) & 0x0F0F0F0F, xw_hi[None], ASM), axis=2).to(tl.float32)
    dm = tl.load(w32_ptr + base, mask=mask_n, other=0)
    d = _f16_bits(dm & 0xFFFF)[:, None]
    dmin = _f16_bits((dm >> 16) & 0xFFFF)[:, None]
    byte = (base * 4)[:, None] + 4
    m2 = mask_n[:, None]
    sc_lo, mn_lo = _scale_min(w8_ptr, byte, (j * 2)[None, :], m2)
    sc_hi, mn_hi = _scale_min(w8_ptr, byte, (j * 2 + 1)[None, :], m2)
    part = (
        d * (sc_lo * (dx_lo[None, :] * i_lo)) - dmin * (mn_lo * sx_lo[None, :])
        + d * (sc_hi * (dx_hi[None, :] * i_hi)) - dmin * (mn_hi * sx_hi[None, :])
    )  # fmt: skip
    return tl.sum(part, axis=1)


@triton.jit
def _words16(w16_ptr, off, mask):
    """int32 words from pairs of 16-bit halves at half offsets `off` and `off` + 1 (blocks
    of 34 or 210 bytes are 2-byte aligned only)."""
    lo = tl.load(w16_ptr + off, mask=mask, other=0).to(tl.int32)
    hi = tl.load(w16_ptr + off + 1, mask=mask, other=0).to(tl.int32)
    return (lo & 0xFFFF) | (hi << 16)


@triton.jit
def _q8_0_words(w16_ptr, blk, mask3):
    """(BN, 4, 8) int32: the 32 int8 codes of the Q8_0 blocks at half offsets `blk` (BN, 4),
    four a word."""
    return _words16(w16_ptr, blk[:, :, None] + 1 + 2 * tl.arange(0, 8)[None, None, :], mask3)


@triton.jit
def q8_0_dot(
    w16_ptr, row_half, sb, xw_lo, xw_hi, dx_lo, dx_hi, mask_n, nblk, ASM: tl.constexpr,
):  # fmt: skip
    """(BLOCK_N,) float32: blocks 8 sb .. 8 sb + 7 (256 weights; those from `nblk`, the row's
    block count, read as zeros) of the Q8_0 rows starting at 16-bit offsets `row_half`
    ({f16 d; i8 q[32]}: 17 halves a block; weight d·q) against one quantized activation
    super-step: Σ_b d[b]·dx[b]·Σ q·xq."""
    b = sb * 8 + tl.arange(0, 4)
    blk_lo = row_half[:, None] + b[None, :] * 17
    blk_hi = blk_lo + 4 * 17
    m_lo = mask_n[:, None] & (b < nblk)[None, :]
    m_hi = mask_n[:, None] & (b + 4 < nblk)[None, :]
    i_lo = tl.sum(dp4a(_q8_0_words(w16_ptr, blk_lo, m_lo[:, :, None]), xw_lo[None], ASM), axis=2)
    i_hi = tl.sum(dp4a(_q8_0_words(w16_ptr, blk_hi, m_hi[:, :, None]), xw_hi[None], ASM), axis=2)
    d_lo = _f16_bits(tl.load(w16_ptr + blk_lo, mask=m_lo, other=0).to(tl.int32) & 0xFFFF)
    d_hi = _f16_bits(tl.load(w16_ptr + blk_hi, mask=m_hi, other=0).to(tl.int32) & 0xFFFF)
    part = d_lo * (dx_lo[None, :] * i_lo.to(tl.float32)) + d_hi * (
        dx_hi[None, :] * i_hi.to(tl.float32)
    )
    return tl.sum(part, axis=1)


@triton.jit
def _q6_k_half(w16_ptr, blk, h: tl.constexpr, xw, dx, mask_n, ASM: tl.constexpr):
    """(BLOCK_N,) float32: sub-blocks 4h .. 4h + 3 of the Q6_K blocks at half offsets `blk`
    (BN,) against the activation words xw (4, 8) and scales dx (4,) of those sub-blocks.
    Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: code c = 4 bits of ql and 2 of qh
    (0..63), weight d·sc[16-group]·(c − 32); Σ (c − 32)·xq = dp4a(c, xq) − 32·Σ xq."""
    j = tl.arange(0, 4)[None, :, None]
    t = tl.arange(0, 8)[None, None, :]
    m3 = mask_n[:, None, None]
    b3 = blk[:, None, None]
    ql = _words16(w16_ptr, b3 + h * 32 + (j % 2) * 16 + 2 * t, m3)
    qh = _words16(w16_ptr, b3 + 64 + h * 16 + 2 * t, m3)  # (BN, 1, 8): every quarter's
    codes = ((ql >> ((j // 2) * 4)) & 0x0F0F0F0F) | (((qh >> (j * 2)) & 0x03030303) << 4)
    dots = dp4a(codes, xw[None], ASM)  # (BN, 4, 8): words 0-3 the first 16 weights
    first = t < 4
    i_a = tl.sum(tl.where(first, dots, 0), axis=2)
    i_b = tl.sum(tl.where(first, 0, dots), axis=2)
    ones = dp4a(xw, tl.full(xw.shape, 0x01010101, tl.int32), ASM)  # Σ xq a word
    first2 = tl.arange(0, 8)[None, :] < 4
    xs_a = tl.sum(tl.where(first2, ones, 0), axis=1)[None, :]
    xs_b = tl.sum(tl.where(first2, 0, ones), axis=1)[None, :]
    sc = tl.load(w16_ptr + blk[:, None] + 96 + h * 4 + tl.arange(0, 4)[None, :],
                 mask=mask_n[:, None], other=0).to(tl.int32)  # fmt: skip
    sc_a = ((sc << 24) >> 24).to(tl.float32)
    sc_b = (sc >> 8).to(tl.float32)
    sums = sc_a * (i_a - 32 * xs_a).to(tl.float32) + sc_b * (i_b - 32 * xs_b).to(tl.float32)
    return tl.sum(dx[None, :] * sums, axis=1)


@triton.jit
def q6_k_dot(
    w16_ptr, row_half, sb, xw_lo, xw_hi, dx_lo, dx_hi, mask_n, ASM: tl.constexpr,
):  # fmt: skip
    """(BLOCK_N,) float32: block `sb` (256 weights, 210 bytes = 105 halves) of the Q6_K rows
    starting at 16-bit offsets `row_half` against one quantized activation super-step
    (sub-blocks 0-3 "lo", 4-7 "hi": the two halves of ql and qh)."""
    blk = row_half + sb * 105
    d = _f16_bits(tl.load(w16_ptr + blk + 104, mask=mask_n, other=0).to(tl.int32) & 0xFFFF)
    lo = _q6_k_half(w16_ptr, blk, 0, xw_lo, dx_lo, mask_n, ASM)
    hi = _q6_k_half(w16_ptr, blk, 1, xw_hi, dx_hi, mask_n, ASM)
    return d * (lo + hi)


@triton.jit
def wdot(
    w8_ptr, wx_ptr, row, sb, xw_lo, xw_hi, dx_lo, dx_hi, sx_lo, sx_hi, mask_n, nblk,
    WTYPE: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """One step of 256 weights of rows of Q4_K (`wx` int32 words), Q8_0 or Q6_K (`wx` int16
    halves); `nblk`: the rows' blocks of 32 (Q8_0 rows may end inside a step)."""
    if WTYPE == Q4_K:
        return q4k_dot(w8_ptr, wx_ptr, row, sb, xw_lo, xw_hi, dx_lo, dx_hi, sx_lo, sx_hi,
                       mask_n, ASM)  # fmt: skip
    elif WTYPE == Q6_K:
        return q6_k_dot(wx_ptr, row, sb, xw_lo, xw_hi, dx_lo, dx_hi, mask_n, ASM)
    else:
        return q8_0_dot(wx_ptr, row, sb, xw_lo, xw_hi, dx_lo, dx_hi, mask_n, nblk, ASM)


@triton.jit
def q8x_moe_gate_up_kernel(
    x_ptr, ids_ptr, w8_ptr, wx_ptr, iw_ptr, id_ptr, is_ptr,
    hidden_dim, inter_dim,
    stride_xt, stride_we, stride_wn, stride_iw, stride_id,
    TOP_K: tl.constexpr, WTYPE: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """grid (T*k, I / 32): h = silu(x·W13[e, n]) * (x·W13[e, I + n]) in float32 for one block
    of 32 columns n, the token's row quantized in the loop, h quantized at the end for the
    down GEMV (its words, d and d·Σq: iw, id, is). W13 of ggml type WTYPE: Q4_K (strides in
    int32 words of `wx`), Q8_0 or Q6_K (strides in int16 halves)."""
    pair = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    offs_n = blk * 32 + tl.arange(0, 32)
    mask_n = offs_n < inter_dim
    gate = e * stride_we + offs_n.to(tl.int64) * stride_wn
    up = gate + inter_dim * stride_wn
    x_row = x_ptr + (pair // TOP_K) * stride_xt
    g = tl.zeros((32,), dtype=tl.float32)
    u = tl.zeros((32,), dtype=tl.float32)
    nblk = hidden_dim // 32
    for sb in range(0, tl.cdiv(hidden_dim, 256)):
        w_lo, w_hi, d_lo, d_hi, s_lo, s_hi = x_quantized(x_row, sb, hidden_dim, WTYPE == Q4_K, ASM)
        g += wdot(w8_ptr, wx_ptr, gate, sb, w_lo, w_hi, d_lo, d_hi, s_lo, s_hi, mask_n, nblk,
                  WTYPE, ASM)  # fmt: skip
        u += wdot(w8_ptr, wx_ptr, up, sb, w_lo, w_hi, d_lo, d_hi, s_lo, s_hi, mask_n, nblk,
                  WTYPE, ASM)  # fmt: skip
    h = _silu_mul(g, u, tl.float32)
    words, d, s = quantize_blocks(tl.reshape(h, (1, 32)), ASM)
    tl.store(iw_ptr + pair * stride_iw + blk * 8 + tl.arange(0, 8), tl.reshape(words, (8,)))
    tl.store(id_ptr + pair * stride_id + blk + tl.arange(0, 1), d)
    tl.store(is_ptr + pair * stride_id + blk + tl.arange(0, 1), s)


@triton.jit
def q8x_moe_down_kernel(
    iw_ptr, id_ptr, is_ptr, ids_ptr, w8_ptr, wx_ptr, y_ptr, weights_ptr, out_ptr, count_ptr,
    hidden_dim, inter_dim,
    stride_iw, stride_id, stride_we, stride_wn, stride_yt, stride_ot,
    BLOCK_N: tl.constexpr, TOP_K: tl.constexpr, COMBINE: tl.constexpr, WTYPE: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    """grid (T*k, cdiv(H, BLOCK_N)): y[pair, n] = inter[pair]·W2[e, n] on the inter the
    gate/up GEMV quantized, rounded to y's dtype; with COMBINE the last of a token's
    programs sums its pairs (`combine_when_last`), as the float down GEMVs do."""
    pair = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hidden_dim
    rows = e * stride_we + offs_n.to(tl.int64) * stride_wn
    iw, idd, iss = iw_ptr + pair * stride_iw, id_ptr + pair * stride_id, is_ptr + pair * stride_id
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    nblk = inter_dim // 32
    for sb in range(0, tl.cdiv(inter_dim, 256)):
        w_lo, w_hi, d_lo, d_hi, s_lo, s_hi = x_loaded(iw, idd, iss, sb, nblk, WTYPE == Q4_K)
        acc += wdot(w8_ptr, wx_ptr, rows, sb, w_lo, w_hi, d_lo, d_hi, s_lo, s_hi, mask_n, nblk,
                    WTYPE, ASM)  # fmt: skip
    y = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + pair * stride_yt + offs_n, y, mask=mask_n)
    if COMBINE:
        combine_when_last(
            y_ptr, weights_ptr, out_ptr, count_ptr, pair, pid_n, tl.num_programs(1), offs_n,
            mask_n, stride_yt, stride_ot, TOP_K,
        )  # fmt: skip


@triton.jit(do_not_specialize=["M"])
def q8x_linear_kernel(
    x_ptr, w8_ptr, wx_ptr, bias_ptr, out_ptr, final_ptr, count_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_os, stride_om, stride_fm,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, REDUCE: tl.constexpr, WTYPE: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    """grid (M, cdiv(N, BLOCK_N), splits): a decode linear of Q4_K, Q8_0 or Q6_K rows on
    one x row a program, quantized in the loop, over its split's super-blocks
    [split * k_per_split, +k_per_split) / 256, stored as the other decode linears
    (`store_split_tile`: the split's partial, or the tile's last split adds them in split
    order, bias included). A row's bits depend on its x row, N, K and the splits only."""
    m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = offs_n.to(tl.int64) * stride_wn
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    sb_start = split * (k_per_split // 256)
    sb_end = tl.minimum(sb_start + k_per_split // 256, tl.cdiv(K, 256))
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for sb in range(sb_start, sb_end):
        w_lo, w_hi, d_lo, d_hi, s_lo, s_hi = x_quantized(x_row, sb, K, WTYPE == Q4_K, ASM)
        acc += wdot(w8_ptr, wx_ptr, rows, sb, w_lo, w_hi, d_lo, d_hi, s_lo, s_hi, mask_n, K // 32,
                    WTYPE, ASM)  # fmt: skip
    offs_m = m + tl.arange(0, 1)
    store_split_tile(
        acc[None, :], out_ptr, bias_ptr, final_ptr, count_ptr, m * tl.num_programs(1) + pid_n,
        split, tl.num_programs(2), offs_m, offs_n, offs_m < M, mask_n, stride_os, stride_om,
        stride_fm, HAS_BIAS, REDUCE, 1, BLOCK_N,
    )  # fmt: skip
