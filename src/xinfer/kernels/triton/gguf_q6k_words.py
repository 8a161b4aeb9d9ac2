"""GGUF Q6_K decode GEMVs by words, factored: the loops of the four-row decode linear
(`gguf_gemm.py`, WORDS; the LM head and attention linears of a Q4_K_M file) and of the MoE
down GEMV (a Q4_K_M file's `ffn_down_exps` in half its layers), where `gguf_tiles.q6k_words`
allows them (Q6K_WORDS). The Q4_K twin of this module is `gguf_q4k_words.py`.

A Q6_K super-block of 256 weights is 210 bytes: ql[128] (low nibbles), qh[64] (high two
bits), scales[16] (int8, one a group of 16 weights), fp16 d. Half n (0, 1) of it holds, for
l = 0..31, bytes ql[64 n + l], ql[64 n + 32 + l] and qh[32 n + l]; the weights of columns
128 n + l + 32 t (t = 0..3) are

    q1 = ql[l] & 15 | (qh[l] & 3) << 4,         q2 = ql[l + 32] & 15 | (qh[l] >> 2 & 3) << 4,
    q3 = ql[l] >> 4 | (qh[l] >> 4 & 3) << 4,    q4 = ql[l + 32] >> 4 | (qh[l] >> 6 & 3) << 4,

each d sc_g (q - 32), g = 8 n + l // 16 + 2 t. So a row's dot with x over group g is

    d sc_g (S_g - 32 X_g),   S_g = sum_j q_j x_j,   X_g = sum_j x_j   (16 columns),

each sum in float32 (the products q x are exact), scaled once per (row, group); X does not
depend on the row. Not the twin's bits (the twin rounds each weight, then sums): float32
throughout, within its tolerance, as the Q4_K word path; deterministic, a row's bits from
its own operations only (not the batch, not the slot that holds an expert).

Tiles. A warp's lanes hold 8 rows x the 4 quarters (n, h) of a super-block: a quarter is
l = 16 h .. 16 h + 15 of half n, so its 64 weights are the four whole groups 8 n + h + 2 t
and each lane's sums and scales are its own (no reduction across lanes in the loop). Blocks
are 210 bytes, so a block's bytes are only 2-aligned (odd blocks start at 2 mod 4; a row of
K = 768 is 630 bytes): for each of its 16 bytes of ql[l], of ql[l + 32] and of qh[l] the lane
loads the five aligned 32-bit words that cover them and funnel-shifts each pair by 0 or 16
bits, one SHF a word (`gguf_tiles.q6k_words` checks a 4-aligned base and even strides);
its four scales as int8 loads, d as an fp16 load. (Eight 16-bit loads a 16 bytes, joined
in pairs, took as many instructions and 38% more loads: 66 against 48 a step of the down
GEMV, sm_90 SASS.) ROWS_T rows
more sit in each thread's registers (BLOCK_N = 8 ROWS_T) and share the activations it loads
and converts; SB warps read SB super-blocks a step. Every load is a flat tile (lanes: the
quarter and row; warps: the super-block; registers: the rest), reshaped after, as
`gguf_q4k_words._flat`.

Decode of a word A of ql[l..l+3], B of ql[l+32..l+35] and H of qh[l..l+3]: the six-bit codes
of bytes 0 and 2 as the fp16 pair of subnormals q 2^-24,

    q1: A & 0x000F000F | (H << 4) & 0x00300030      q2: B & 0x000F000F | (H << 2) & 0x00300030
    q3: A & 0x00F000F0 | (H << 4) & 0x03000300      q4: B & 0x00F000F0 | (H << 2) & 0x03000300

(q3 and q4 as 16 q 2^-24), and of bytes 1 and 3 the same from A >> 8, B >> 8, H >> 4 and
H >> 6: six shifts, sixteen logic ops and sixteen conversions (one a half) for 16 weights;
the powers of two go into the scales. S is one chain of 16 fused multiply-adds a group; X
is summed by each lane from the 16 activations of each of its groups (shared by its ROWS_T
rows).

sm_90 SASS (`bench/sass_report.py --cases gguf-q6_k-words,linear-gguf-q6_k-words,
head-gguf-q6_k-words`, Triton 3.9 and 3.6 alike to +-0.006, at `gguf_tiles`' tiles): no
shared memory, barrier or spill in the loops; 0.159 / 0.173 warp instructions a weight (MoE
gate/up, down) where the byte path takes 0.696 / 0.693, and 0.388 for the four-row linear
(0.386 the LM head's one-warp tile; the loop holds all four rows' code, counted against one
row's weights, as the Q4_K word linear's 0.318) where the byte path's four-row tile takes
1.047. Per 16
weights a row: 6 shifts, 16 logic ops, 16 conversions and 16 fused multiply-adds, and 2
more a group; the rest is the 12 funnel shifts and 15 loads a lane a block, the scales and
the activations (their X sums: 60 adds a lane a block, shared by its ROWS_T rows)."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.gguf_q4k_words import (
    _bf16_hi,
    _bf16_lo,
    _flat,
    _halves,
    _row_offsets,
    _rows_out,
    _steps,
)

SUPER_HALVES = tl.constexpr(105)  # 210 bytes a super-block


@triton.jit
def _flat1(NR: tl.constexpr, SB: tl.constexpr):
    """`_flat` of a 1-D tile (one 16-bit element a row): indices (outer, s, ln, g), each
    (NR * SB * 32,), of element ((outer * SB + s) * 8 + ln) * 4 + g."""
    i = tl.arange(0, NR * SB * 32)
    return i // (SB * 32), (i // 32) % SB, (i // 4) % 8, i % 4


@triton.jit
def _four(t):
    """The four tensors t[..., u] of a thread's last dim (4), u = 0..3."""
    e, o = tl.split(tl.reshape(t, t.shape[:-1] + (2, 2)))  # u = 2 p + q: q = 0, 1
    t0, t2 = tl.split(e)
    t1, t3 = tl.split(o)
    return t0, t1, t2, t3


@triton.jit
def _funnel(lo, hi, sh, ASM: tl.constexpr):
    """The 32 bits of the 64-bit hi:lo from bit sh (0 or 16) on: one funnel shift."""
    if ASM:
        w = tl.inline_asm_elementwise(
            "shf.r.wrap.b32 $0, $1, $2, $3;", "=r,r,r,r", [lo, hi, sh], dtype=tl.int32,
            is_pure=True, pack=1,
        )  # fmt: skip
    else:
        wide = (hi.to(tl.uint32).to(tl.uint64) << 32) | lo.to(tl.uint32).to(tl.uint64)
        w = (wide >> sh.to(tl.uint64)).to(tl.uint32).to(tl.int32, bitcast=True)
    return w


@triton.jit
def _block_words(w32, sh, g, AT: tl.constexpr, ROWS_T: tl.constexpr, SB: tl.constexpr,
             ASM: tl.constexpr):  # fmt: skip
    """The four 32-bit words (ROWS_T, SB, 8, 4 quarters) each of the 16 bytes that every lane
    reads of its block (flat, `_flat1`: `w32` its block's first byte rounded down to 4, `sh`
    16 where the block starts at 2 mod 4, else 0; g the quarter). A block's bytes are only
    2-aligned (odd blocks start at 2 mod 4), so the lane loads the five aligned words that
    cover them and funnel-shifts each pair. AT, of quarter g = 2 n + h: 0 ql[64 n + 16 h ..],
    1 ql[64 n + 32 + 16 h ..], 2 qh[32 n + 16 h ..] (qh at byte 128); the fifth word ends at
    most 2 bytes past the range, inside the block."""
    if AT == 2:
        p = w32 + (32 + 8 * (g // 2) + 4 * (g % 2))
    else:
        p = w32 + (16 * (g // 2) + 4 * (g % 2) + 8 * AT)
    v0 = tl.load(p)
    v1 = tl.load(p + 1)
    v2 = tl.load(p + 2)
    v3 = tl.load(p + 3)
    v4 = tl.load(p + 4)
    w0 = tl.reshape(_funnel(v0, v1, sh, ASM), (ROWS_T, SB, 8, 4))
    w1 = tl.reshape(_funnel(v1, v2, sh, ASM), (ROWS_T, SB, 8, 4))
    w2 = tl.reshape(_funnel(v2, v3, sh, ASM), (ROWS_T, SB, 8, 4))
    w3 = tl.reshape(_funnel(v3, v4, sh, ASM), (ROWS_T, SB, 8, 4))
    return w0, w1, w2, w3


@triton.jit
def _unit(a, b, h, ASM: tl.constexpr):
    """The 16 codes of words a (ql[l..l+3]), b (ql[l+32..]) and h (qh[l..l+3]) as float32:
    ((q1, q2, q3, q4) of bytes 0, 1, 2, 3), q1 and q2 as q 2^-24, q3 and q4 as 16 q 2^-24."""
    h4 = h << 4
    hm4 = h >> 4  # arithmetic: the sign bits land above every mask
    h2 = h << 2
    hm6 = h >> 6
    a8 = a >> 8
    b8 = b >> 8
    q1_0, q1_2 = _halves((a & 0x000F000F) | (h4 & 0x00300030), ASM)
    q1_1, q1_3 = _halves((a8 & 0x000F000F) | (hm4 & 0x00300030), ASM)
    q2_0, q2_2 = _halves((b & 0x000F000F) | (h2 & 0x00300030), ASM)
    q2_1, q2_3 = _halves((b8 & 0x000F000F) | (hm6 & 0x00300030), ASM)
    q3_0, q3_2 = _halves((a & 0x00F000F0) | (h4 & 0x03000300), ASM)
    q3_1, q3_3 = _halves((a8 & 0x00F000F0) | (hm4 & 0x03000300), ASM)
    q4_0, q4_2 = _halves((b & 0x00F000F0) | (h2 & 0x03000300), ASM)
    q4_1, q4_3 = _halves((b8 & 0x00F000F0) | (hm6 & 0x03000300), ASM)
    return ((q1_0, q1_1, q1_2, q1_3), (q2_0, q2_1, q2_2, q2_3), (q3_0, q3_1, q3_2, q3_3),
            (q4_0, q4_1, q4_2, q4_3))  # fmt: skip


@triton.jit
def q6k_decode(w8, rows, kb, kb_end, ROWS_T: tl.constexpr, SB: tl.constexpr,
               ASM: tl.constexpr):  # fmt: skip
    """Super-blocks kb .. kb + SB (one a warp; clamped to kb_end - 1, those past it counting
    as 0) of the program's ROWS_T x 8 rows `rows` (`_row_offsets`) of the byte pointer `w8`:
    the codes as float32 (ROWS_T, SB, 8, 4 quarters), units u = 0..3 (l = 16 h + 4 u ..) each
    of (q1, q2, q3, q4) x bytes 0..3 (`_unit`); the scales d sc_t of the quarter's groups t =
    0..3; and d."""
    # the block of each (row, quarter): its 16-bit offset, its words from the one at or
    # below it, and scales[8 n + h + 2 t] (byte 192 on) and d (byte 208)
    r, s, ln, g = _flat1(ROWS_T, SB)
    kbs, valid = _steps(s, kb, kb_end)
    blk = _row_offsets(rows, r, ln) + kbs * SUPER_HALVES
    w32 = w8.to(tl.pointer_type(tl.int32)) + (blk >> 1)
    sh = (blk & 1).to(tl.int32) * 16
    a0, a1, a2, a3 = _block_words(w32, sh, g, 0, ROWS_T, SB, ASM)
    b0, b1, b2, b3 = _block_words(w32, sh, g, 1, ROWS_T, SB, ASM)
    h0, h1, h2, h3 = _block_words(w32, sh, g, 2, ROWS_T, SB, ASM)
    w16 = w8.to(tl.pointer_type(tl.uint16))
    if SB > 1:  # a step past the range: d = 0
        d = tl.load(w16.to(tl.pointer_type(tl.float16)) + blk + 104, mask=valid, other=0.0)
    else:
        d = tl.load(w16.to(tl.pointer_type(tl.float16)) + blk + 104)
    d = tl.reshape(d.to(tl.float32), (ROWS_T, SB, 8, 4))
    sc8 = w8.to(tl.pointer_type(tl.int8)) + 2 * blk + 192 + 8 * (g // 2) + g % 2
    s0 = d * tl.reshape(tl.load(sc8).to(tl.float32), (ROWS_T, SB, 8, 4))
    s1 = d * tl.reshape(tl.load(sc8 + 2).to(tl.float32), (ROWS_T, SB, 8, 4))
    s2 = d * tl.reshape(tl.load(sc8 + 4).to(tl.float32), (ROWS_T, SB, 8, 4))
    s3 = d * tl.reshape(tl.load(sc8 + 6).to(tl.float32), (ROWS_T, SB, 8, 4))
    v = (_unit(a0, b0, h0, ASM), _unit(a1, b1, h1, ASM), _unit(a2, b2, h2, ASM),
         _unit(a3, b3, h3, ASM))  # fmt: skip
    return v, (s0, s1, s2, s3), d


@triton.jit
def q6k_x(x_row, kb, kb_end, SB: tl.constexpr, ASM: tl.constexpr):
    """The activations of super-blocks kb .. kb + SB (one a warp; clamped to kb_end - 1), the
    same for every row, at `q6k_decode`'s order: xs[u][t][b] (SB, 8, 4 quarters) of column
    128 n + 16 h + 4 u + 32 t + b; and the sums X[t] (SB, 8, 4) of each quarter's group t,
    times 32. Loaded 16 bytes at a time (bf16 / fp16 as 32-bit words of two, converted a half
    an instruction)."""
    c = tl.arange(0, 4)[None, :]
    if x_row.dtype.element_ty == tl.float32:  # (4 t, 4 u, SB, 8, 4 g, 4 b)
        o, s, _, g = _flat(16, SB)
        kbs, _ = _steps(s, kb, kb_end)
        cols = kbs * 256 + 128 * (g // 2) + 16 * (g % 2) + 32 * (o // 4) + 4 * (o % 4) + c
        cols = tl.max_contiguous(tl.multiple_of(cols, [1, 4]), [1, 4])
        xv = tl.reshape(tl.load(x_row + cols), (4, 4, SB, 8, 4, 4))
        xv = tl.permute(xv, (2, 3, 4, 1, 0, 5))  # (SB, 8, 4 g, 4 u, 4 t, 4 b)
        e, o2 = tl.split(tl.reshape(xv, (SB, 8, 4, 4, 4, 2, 2)))  # b = 2 p + q
        b0, b2 = tl.split(e)
        b1, b3 = tl.split(o2)
    else:  # (4 t, 2 v, SB, 8, 4 g, 4 words): words 2 v + a of t, columns 4 (2 v + a) + 2 c
        o, s, _, g = _flat(8, SB)
        kbs, _ = _steps(s, kb, kb_end)
        words = kbs * 128 + 64 * (g // 2) + 8 * (g % 2) + 16 * (o // 2) + 4 * (o % 2) + c
        words = tl.max_contiguous(tl.multiple_of(words, [1, 4]), [1, 4])
        x32 = x_row.to(tl.pointer_type(tl.int32))
        wv = tl.reshape(tl.load(x32 + words), (4, 2, SB, 8, 4, 2, 2))  # (t, v, .., u2, a)
        wv = tl.permute(wv, (2, 3, 4, 1, 5, 0, 6))  # (SB, 8, 4 g, 2 v, 2 u2, 4 t, 2 a)
        wv = tl.reshape(wv, (SB, 8, 4, 4, 4, 2))  # u = 2 v + u2
        w01, w23 = tl.split(wv)  # columns 4 u + (0, 1), 4 u + (2, 3)
        if x_row.dtype.element_ty == tl.bfloat16:
            b0, b1, b2, b3 = _bf16_lo(w01), _bf16_hi(w01), _bf16_lo(w23), _bf16_hi(w23)
        else:
            b0, b1 = _halves(w01, ASM)
            b2, b3 = _halves(w23, ASM)
    # b_i: (SB, 8, 4 g, 4 u, 4 t) → xs[u][t][i]
    b0u, b1u, b2u, b3u = _four(tl.permute(b0, (0, 1, 2, 4, 3)))  # [u] (SB, 8, 4, 4 t)
    c0u, c1u, c2u, c3u = _four(tl.permute(b1, (0, 1, 2, 4, 3)))
    d0u, d1u, d2u, d3u = _four(tl.permute(b2, (0, 1, 2, 4, 3)))
    e0u, e1u, e2u, e3u = _four(tl.permute(b3, (0, 1, 2, 4, 3)))
    xs = (_by_t(b0u, c0u, d0u, e0u), _by_t(b1u, c1u, d1u, e1u), _by_t(b2u, c2u, d2u, e2u),
          _by_t(b3u, c3u, d3u, e3u))  # fmt: skip
    sums = tl.sum(b0 + b1 + b2 + b3, 3) * 32.0  # (SB, 8, 4 g, 4 t)
    x0, x1, x2, x3 = _four(sums)
    return xs, (x0, x1, x2, x3)


@triton.jit
def _by_t(b0, b1, b2, b3):
    """Bytes 0..3's (…, 4 t) tiles → ((b0..b3) of t) for t = 0..3."""
    p0, p1, p2, p3 = _four(b0)
    q0, q1, q2, q3 = _four(b1)
    r0, r1, r2, r3 = _four(b2)
    s0, s1, s2, s3 = _four(b3)
    return (p0, q0, r0, s0), (p1, q1, r1, s1), (p2, q2, r2, s2), (p3, q3, r3, s3)


@triton.jit
def q6k_word_sums(dec, xs):
    """(ROWS_T, SB, 8, 4) float32: each row's dot over each quarter's four groups,
    sum_t d sc_t (S_t - 32 X_t), of decoded super-blocks (`q6k_decode`) with their
    activations (`q6k_x`), within a thread: S_t as one chain of 16 fused multiply-adds."""
    v, sc, d = dec
    xv, x32 = xs
    acc = tl.zeros_like(d)
    for t in tl.static_range(0, 4):
        p = v[0][t][0] * xv[0][t][0][None]
        for u in tl.static_range(0, 4):
            for b in tl.static_range(0, 4):
                if u + b > 0:
                    p = tl.fma(v[u][t][b], xv[u][t][b][None], p)
        # (d sc_t) (2^24 S' - 32 X), S' the sum of the subnormal codes q 2^-24 (t = 0, 1) or
        # 16 q 2^-24 (t = 2, 3): two fused multiply-adds (the power of two is exact)
        if t < 2:
            acc = tl.fma(sc[t], tl.fma(p, 16777216.0, -x32[t][None]), acc)
        else:
            acc = tl.fma(sc[t], tl.fma(p, 1048576.0, -x32[t][None]), acc)
    return acc


@triton.jit
def q6k_row_dot(x_row, w8, rows, kb_start, kb_end, ROWS_T: tl.constexpr, SB: tl.constexpr,
                ASM: tl.constexpr):  # fmt: skip
    """(BLOCK_N,) float32: x_row · the program's BLOCK_N = 8 ROWS_T Q6_K rows `rows`
    (`_row_offsets`, 16-bit units) over super-blocks kb_start .. kb_end, SB a step."""
    acc = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    for kb in range(kb_start, kb_end, SB):
        xs = q6k_x(x_row, kb, kb_end, SB, ASM)
        acc += q6k_word_sums(q6k_decode(w8, rows, kb, kb_end, ROWS_T, SB, ASM), xs)
    return _rows_out(acc, ROWS_T)


@triton.jit
def q6k_pair_dot(x_row, w8, rows, rows2, kb_end, ROWS_T: tl.constexpr, SB: tl.constexpr,
                 ASM: tl.constexpr):  # fmt: skip
    """`q6k_row_dot` of two row sets (a gate/up GEMV's gate and up rows) in one loop from
    super-block 0, the activations loaded and summed once for both."""
    acc = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc2 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    for kb in range(0, kb_end, SB):
        xs = q6k_x(x_row, kb, kb_end, SB, ASM)
        acc += q6k_word_sums(q6k_decode(w8, rows, kb, kb_end, ROWS_T, SB, ASM), xs)
        acc2 += q6k_word_sums(q6k_decode(w8, rows2, kb, kb_end, ROWS_T, SB, ASM), xs)
    return _rows_out(acc, ROWS_T), _rows_out(acc2, ROWS_T)


@triton.jit
def q6k_four_rows_dot(x0, stride_xm, more, w8, rows, kb_start, kb_end, ROWS_T: tl.constexpr,
                      SB: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """Four (BLOCK_N,) float32 dots: x rows x0, x0 + stride_xm, ... · the program's Q6_K rows
    `rows` over super-blocks kb_start .. kb_end, each super-block decoded once for the four;
    x row r > 0 only where r < `more`, else 0. One build for every call, one row too (as
    `gguf_q4k_words.q4k_four_rows_dot`: a row's bits may not depend on the batch)."""
    acc0 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc1 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc2 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc3 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    for kb in range(kb_start, kb_end, SB):
        dec = q6k_decode(w8, rows, kb, kb_end, ROWS_T, SB, ASM)
        acc0 += q6k_word_sums(dec, q6k_x(x0, kb, kb_end, SB, ASM))
        if 1 < more:
            acc1 += q6k_word_sums(dec, q6k_x(x0 + stride_xm, kb, kb_end, SB, ASM))
        if 2 < more:
            acc2 += q6k_word_sums(dec, q6k_x(x0 + 2 * stride_xm, kb, kb_end, SB, ASM))
        if 3 < more:
            acc3 += q6k_word_sums(dec, q6k_x(x0 + 3 * stride_xm, kb, kb_end, SB, ASM))
    return (_rows_out(acc0, ROWS_T), _rows_out(acc1, ROWS_T), _rows_out(acc2, ROWS_T),
            _rows_out(acc3, ROWS_T))  # fmt: skip
