"""GGUF Q8_0 decode GEMVs by words, factored: the loops of the four-row decode linear
(`gguf_gemm.py`, WORDS; the LM head too) and of the MoE gate/up and down GEMVs of a Q8_0
file, where `gguf_tiles.q80_words` allows them (Q80_WORDS). The Q6_K and Q4_K twins of this
module are `gguf_q6k_words.py` and `gguf_q4k_words.py`.

A Q8_0 block of 32 weights is 34 bytes: fp16 d, then 32 int8 codes q, each weight d q. Two
blocks are 68 bytes, 17 32-bit words where a row starts on a 4-byte boundary: word 0 holds
d of the even block and its codes 0, 1; words 1..7 its codes 4 j - 2 .. 4 j + 1; word 8 its
codes 30, 31 and d of the odd block; words 9..16 the odd block's codes. So no word
straddles what it needs: the even block's codes sit 2 bytes off their activations' 4-column
groups, which only renames the activations a byte multiplies (no shift of the weights, no
funnel shift as Q6_K's 2-aligned blocks need).

A code's byte b XOR 128 is q + 128 (0..255); bytes 0 and 2 of a word, `(w ^ 0x80808080) &
0x00FF00FF`, are the fp16 pair of subnormals (q + 128) 2^-24, converted to float32 exactly
one an instruction, and `w >> 8` the same for bytes 1 and 3. A row's dot with x over a block
is then

    d (2^24 S - 128 X),   S = sum_j (q_j + 128) 2^-24 x_j,   X = sum_j x_j   (32 columns),

S one chain of 32 fused multiply-adds a block (the products are exact), then two fused
multiply-adds; X does not depend on the row (`gguf_q4k_words._x_sums`: a 16-byte load and
shuffles, the blocks of a 64-column pair are that function's even and odd sub-blocks). Not
the twin's bits (the twin rounds each weight, then sums): float32 throughout, within its
tolerance, as the Q4_K and Q6_K word paths; deterministic, a row's bits from its own
operations only (not the batch, not the slot that holds an expert).

Tiles. 256 columns (8 blocks, 272 bytes, 68 words) make the path's "super-block", so the
launcher's word tiles, splits and steps are the other word paths' (K a multiple of 256). A
warp's lanes hold 8 rows x the 4 block pairs g of a super-block, each lane its pair's 17
words and the 64 activations of its columns (16-byte loads), so each lane's sums and scales
are its own: no reduction across lanes in the loop. A pair starts 68 g bytes into the
super-block, 8-aligned for even g and 4 bytes past for odd g (`gguf_tiles.q80_words` asks
8-aligned rows and base): the lane loads the 18 words from the 8-aligned one at or below
its pair as nine 64-bit loads and odd lanes select words 1..17 (one SEL a word). Seventeen
32-bit loads a pair took 8% fewer instructions (0.118 / 0.130 / 0.319 a weight) but each
warp load touched ~20 L1 lines (8 rows x 4 pairs 68 bytes apart) for 128 bytes: 340 line
accesses a step of 8 rows where the 64-bit loads take ~180 (an estimate, not measured; by
the same count the Q6_K word path takes ~180 for 1680 bytes, and it read its LM head at 1.9
TB/s on an H100). ROWS_T rows more sit in each thread's
registers (BLOCK_N = 8 ROWS_T) and share the activations it loads and converts; SB warps
read SB super-blocks a step. Every load is a flat tile (lanes: the pair and row; warps: the
super-block; registers: the rest), reshaped after, as `gguf_q4k_words._flat`.

sm_90 SASS (`bench/sass_report.py --cases gguf-q8_0-words,linear-gguf-q8_0-words,
head-gguf-q8_0-words`, Triton 3.9, at `gguf_tiles`' tiles): no shared memory, barrier or
spill in the loops; 0.127 / 0.138 warp instructions a weight (MoE gate/up, down) where the
byte path takes 0.350 / 0.422, and 0.328 for the four-row linear (0.326 the LM head's
one-warp tile; all four rows' code against one row's weights) where the byte path takes
0.678. Per 4 codes a row: an XOR, two byte permutes, four conversions and four fused
multiply-adds, and two more multiply-adds a block; the rest is the loads and selects (27
a lane a pair) and the activations (one conversion each, shared by the lane's ROWS_T rows,
and their X sums)."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.gguf_q4k_words import (
    _bf16_hi,
    _bf16_lo,
    _eight,
    _flat,
    _halves,
    _row_offsets,
    _rows_out,
    _steps,
    _x_sums,
)
from xinfer.kernels.triton.gguf_q6k_words import _flat1, _four
from xinfer.kernels.triton.quant_dequant import _half_hi, _half_lo

SUPER_WORDS80 = tl.constexpr(68)  # 256 weights: 8 blocks of 34 bytes
FLIP = tl.constexpr(-2139062144)  # 0x80808080 as an int32: each byte's sign bit


@triton.jit
def _q80_w(w64, offs, valid, ROWS_T: tl.constexpr, SB: tl.constexpr, MASKED: tl.constexpr):
    """The low and high words of the 64-bit words at `offs` (flat, `_flat1`: one load a
    lane) as two (ROWS_T, SB, 8, 4) int32 tiles; MASKED: 0 where not `valid`."""
    if MASKED:
        w = tl.load(w64 + offs, mask=valid, other=0)
    else:
        w = tl.load(w64 + offs)
    w = tl.reshape(w, (ROWS_T, SB, 8, 4))
    return w.to(tl.int32), (w >> 32).to(tl.int32)


@triton.jit
def _q80_half(w, HI: tl.constexpr, ASM: tl.constexpr):
    """The low (HI False) or high fp16 half of int32 words as float32: one conversion."""
    if ASM:
        if HI:
            v = tl.inline_asm_elementwise(
                "{ .reg .b16 l, h; mov.b32 {l, h}, $1; cvt.f32.f16 $0, h; }", "=f,r", [w],
                dtype=tl.float32, is_pure=True, pack=1,
            )  # fmt: skip
        else:
            v = tl.inline_asm_elementwise(
                "{ .reg .b16 l, h; mov.b32 {l, h}, $1; cvt.f32.f16 $0, l; }", "=f,r", [w],
                dtype=tl.float32, is_pure=True, pack=1,
            )  # fmt: skip
    elif HI:
        v = _half_hi(w)
    else:
        v = _half_lo(w)
    return v


@triton.jit
def _q80_codes(w, ASM: tl.constexpr):
    """The four codes of int32 words `w` as float32 (q + 128) 2^-24, bytes 0, 1, 2, 3. ASM:
    one XOR and two byte permutes a word (bytes 0, 2 and 1, 3 into the halves' low bytes),
    then a conversion a code (inline PTX); the plain ops' masks took a register that ptxas
    rematerialized about once every two words (sm_90 SASS)."""
    if ASM:
        c0, c1, c2, c3 = tl.inline_asm_elementwise(
            "{ .reg .b32 t, l, h; .reg .b16 a, b, c, d; xor.b32 t, $4, 0x80808080; "
            "prmt.b32 l, t, 0, 0x4240; prmt.b32 h, t, 0, 0x4341; mov.b32 {a, c}, l; "
            "mov.b32 {b, d}, h; cvt.f32.f16 $0, a; cvt.f32.f16 $1, b; cvt.f32.f16 $2, c; "
            "cvt.f32.f16 $3, d; }",
            "=f,=f,=f,=f,r", [w], dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True, pack=1,
        )  # fmt: skip
    else:
        c0, c2 = _halves((w ^ FLIP) & 0x00FF00FF, ASM)
        c1, c3 = _halves(((w >> 8) ^ FLIP) & 0x00FF00FF, ASM)
    return c0, c1, c2, c3


@triton.jit
def q80_decode(w32, rows, kb, kb_end, ROWS_T: tl.constexpr, SB: tl.constexpr,
               ASM: tl.constexpr):  # fmt: skip
    """The 17 words (ROWS_T, SB, 8, 4 pairs) of each lane's block pair of super-blocks kb ..
    kb + SB (one a warp; clamped to kb_end - 1) of the program's ROWS_T x 8 rows `rows`
    (`_row_offsets`, 32-bit units, 8-byte aligned) of the int32 pointer `w32`, and the two
    blocks' d (float32; 0 for a step past the range). Pair g starts at word 17 g of the
    super-block: 8-aligned for even g, 4 bytes past for odd g, so the lane loads the 18 words
    from the 8-aligned one at or below it (nine 64-bit loads) and odd lanes take words 1..17
    of them (a select a word). (Seventeen 32-bit loads a pair touched ~20 L1 lines a warp
    load, 8 rows x 4 pairs 68 bytes apart; nine 64-bit loads about as many each.)"""
    r, s, ln, g = _flat1(ROWS_T, SB)
    kbs, valid = _steps(s, kb, kb_end)
    odd = (tl.arange(0, 4) % 2 == 1)[None, None, None, :]  # the lanes of odd pairs
    # the pair's first word rounded down to even, in 64-bit units: two words a load
    w64 = w32.to(tl.pointer_type(tl.int64))
    base = (_row_offsets(rows, r, ln) + kbs * SUPER_WORDS80 + 17 * g - g % 2) // 2
    m: tl.constexpr = SB > 1  # a step past the range: the words of d read as 0, so d = 0
    v0, v1 = _q80_w(w64, base, valid, ROWS_T, SB, m)
    v2, v3 = _q80_w(w64, base + 1, valid, ROWS_T, SB, False)
    v4, v5 = _q80_w(w64, base + 2, valid, ROWS_T, SB, False)
    v6, v7 = _q80_w(w64, base + 3, valid, ROWS_T, SB, False)
    v8, v9 = _q80_w(w64, base + 4, valid, ROWS_T, SB, m)
    v10, v11 = _q80_w(w64, base + 5, valid, ROWS_T, SB, False)
    v12, v13 = _q80_w(w64, base + 6, valid, ROWS_T, SB, False)
    v14, v15 = _q80_w(w64, base + 7, valid, ROWS_T, SB, False)
    v16, v17 = _q80_w(w64, base + 8, valid, ROWS_T, SB, False)
    w0 = tl.where(odd, v1, v0)
    w8 = tl.where(odd, v9, v8)
    ws = (
        w0, tl.where(odd, v2, v1), tl.where(odd, v3, v2), tl.where(odd, v4, v3),
        tl.where(odd, v5, v4), tl.where(odd, v6, v5), tl.where(odd, v7, v6),
        tl.where(odd, v8, v7), w8, tl.where(odd, v10, v9), tl.where(odd, v11, v10),
        tl.where(odd, v12, v11), tl.where(odd, v13, v12), tl.where(odd, v14, v13),
        tl.where(odd, v15, v14), tl.where(odd, v16, v15), tl.where(odd, v17, v16),
    )  # fmt: skip
    return ws, _q80_half(w0, False, ASM), _q80_half(w8, True, ASM)


@triton.jit
def _q80_x64(t):
    """(SB, 8, 4, 64) → its 64 tensors t[..., m] (SB, 8, 4), as
    xs[rev3(m % 8)][rev3(m // 8)] (rev3: three bits reversed, `_q80_xcol`)."""
    e = _eight(tl.reshape(t, t.shape[:-1] + (8, 2, 2, 2)))  # [m % 8]: (…, 8 m // 8)
    return (
        _eight(tl.reshape(e[0], t.shape[:-1] + (2, 2, 2))),
        _eight(tl.reshape(e[1], t.shape[:-1] + (2, 2, 2))),
        _eight(tl.reshape(e[2], t.shape[:-1] + (2, 2, 2))),
        _eight(tl.reshape(e[3], t.shape[:-1] + (2, 2, 2))),
        _eight(tl.reshape(e[4], t.shape[:-1] + (2, 2, 2))),
        _eight(tl.reshape(e[5], t.shape[:-1] + (2, 2, 2))),
        _eight(tl.reshape(e[6], t.shape[:-1] + (2, 2, 2))),
        _eight(tl.reshape(e[7], t.shape[:-1] + (2, 2, 2))),
    )  # fmt: skip


@triton.jit
def _q80_x32(t):
    """(SB, 8, 4, 32) → its 32 tensors t[..., m] (SB, 8, 4), as xs[rev3(m % 8)][m // 8]."""
    e = _eight(tl.reshape(t, t.shape[:-1] + (4, 2, 2, 2)))  # [m % 8]: (…, 4 m // 8)
    return (_four(e[0]), _four(e[1]), _four(e[2]), _four(e[3]), _four(e[4]), _four(e[5]),
            _four(e[6]), _four(e[7]))  # fmt: skip


@triton.jit
def q80_x(x_row, kb, kb_end, SB: tl.constexpr, ASM: tl.constexpr):
    """The activations of super-blocks kb .. kb + SB (one a warp; clamped to kb_end - 1), the
    same for every row, at `q80_decode`'s order: for 16-bit x, the lo and hi float32 of its
    32-bit words, word m of a lane (columns 64 g + 2 m, + 1) (SB, 8, 4 pairs) each (`_q80_x32`);
    for float32, column 64 g + m (`_q80_x64`; lo = hi); both read by `_q80_xcol`; and
    128 X of the pair's even and odd block (`_x_sums`)."""
    c = tl.arange(0, 4)[None, :]
    if x_row.dtype.element_ty == tl.float32:  # (16 o, SB, 8, 4 g, 4 c): column 4 o + c
        o, s, _, g = _flat(16, SB)
        kbs, _ = _steps(s, kb, kb_end)
        cols = kbs * 256 + 64 * g + 4 * o + c
        cols = tl.max_contiguous(tl.multiple_of(cols, [1, 4]), [1, 4])
        xv = tl.reshape(tl.load(x_row + cols), (16, SB, 8, 4, 4))
        xv = tl.reshape(tl.permute(xv, (1, 2, 3, 0, 4)), (SB, 8, 4, 64))
        lo = _q80_x64(xv)
        hi = lo
    else:  # (8 o, SB, 8, 4 g, 4 c): word 4 o + c
        o, s, _, g = _flat(8, SB)
        kbs, _ = _steps(s, kb, kb_end)
        words = kbs * 128 + 32 * g + 4 * o + c
        words = tl.max_contiguous(tl.multiple_of(words, [1, 4]), [1, 4])
        wv = tl.reshape(tl.load(x_row.to(tl.pointer_type(tl.int32)) + words), (8, SB, 8, 4, 4))
        wv = tl.reshape(tl.permute(wv, (1, 2, 3, 0, 4)), (SB, 8, 4, 32))
        if x_row.dtype.element_ty == tl.bfloat16:
            lo, hi = _q80_x32(_bf16_lo(wv)), _q80_x32(_bf16_hi(wv))
        else:
            xl, xh = _halves(wv, ASM)
            lo, hi = _q80_x32(xl), _q80_x32(xh)
    se, so = _x_sums(x_row, kb, kb_end, SB, ASM)
    return lo, hi, se * 128.0, so * 128.0


@triton.jit
def _q80_xcol(xs, col: tl.constexpr, F32: tl.constexpr):
    """The activation of column `col` (0..63) of a lane's pair from `q80_x`'s tiles. An
    element i (0..7) of three dims sits at i's three bits reversed in `gguf_q4k_words._eight`'s
    tuple (its last dim varies slowest there). The positions are computed here from `col`
    into `tl.constexpr` names, so they stay compile-time constants: a `@triton.jit` helper
    returning them, or a name without the annotation, is a tensor under Triton 3.6 (the GPU's),
    which a tuple cannot be indexed by: its sm_90 compile failed there."""
    lo, hi = xs[0], xs[1]
    if F32:
        a: tl.constexpr = col % 8
        b: tl.constexpr = col // 8
        v = lo[(a % 2) * 4 + (a // 2 % 2) * 2 + a // 4][(b % 2) * 4 + (b // 2 % 2) * 2 + b // 4]
    else:
        h: tl.constexpr = (col // 2) % 8
        if col % 2 == 0:
            v = lo[(h % 2) * 4 + (h // 2 % 2) * 2 + h // 4][col // 16]
        else:
            v = hi[(h % 2) * 4 + (h // 2 % 2) * 2 + h // 4][col // 16]
    return v


@triton.jit
def q80_word_sums(dec, xs, F32: tl.constexpr, ASM: tl.constexpr):
    """(ROWS_T, SB, 8, 4) float32: each row's dot over each lane's block pair,
    d (2^24 S - 128 X) of each block, of decoded words (`q80_decode`) with their activations
    (`q80_x`; F32: float32 activations), within a thread: S as one chain of fused
    multiply-adds a block. Byte b of word j is column 4 j + b - 2 (the even block: words 0-8,
    word 0's bytes 2, 3 and word 8's bytes 0, 1 its ends) or 32 + 4 (j - 9) + b (the odd
    block: words 9-16)."""
    ws, d_e, d_o = dec
    x128e, x128o = xs[2], xs[3]
    # the even block's ends: word 0's bytes 2, 3 (columns 0, 1), word 8's bytes 0, 1 (30, 31)
    w0, w8 = ws[0], ws[8]
    e = _q80_half((w0 ^ FLIP) & 0x00FF00FF, True, ASM) * _q80_xcol(xs, 0, F32)[None]
    e = tl.fma(
        _q80_half(((w0 >> 8) ^ FLIP) & 0x00FF00FF, True, ASM), _q80_xcol(xs, 1, F32)[None], e
    )
    for j in tl.static_range(1, 8):
        c0, c1, c2, c3 = _q80_codes(ws[j], ASM)
        e = tl.fma(c0, _q80_xcol(xs, 4 * j - 2, F32)[None], e)
        e = tl.fma(c1, _q80_xcol(xs, 4 * j - 1, F32)[None], e)
        e = tl.fma(c2, _q80_xcol(xs, 4 * j, F32)[None], e)
        e = tl.fma(c3, _q80_xcol(xs, 4 * j + 1, F32)[None], e)
    e = tl.fma(_q80_half((w8 ^ FLIP) & 0x00FF00FF, False, ASM), _q80_xcol(xs, 30, F32)[None], e)
    e = tl.fma(
        _q80_half(((w8 >> 8) ^ FLIP) & 0x00FF00FF, False, ASM), _q80_xcol(xs, 31, F32)[None], e
    )
    c0, c1, c2, c3 = _q80_codes(ws[9], ASM)
    o = c0 * _q80_xcol(xs, 32, F32)[None]
    o = tl.fma(c1, _q80_xcol(xs, 33, F32)[None], o)
    o = tl.fma(c2, _q80_xcol(xs, 34, F32)[None], o)
    o = tl.fma(c3, _q80_xcol(xs, 35, F32)[None], o)
    for j in tl.static_range(10, 17):
        c0, c1, c2, c3 = _q80_codes(ws[j], ASM)
        o = tl.fma(c0, _q80_xcol(xs, 4 * j - 4, F32)[None], o)
        o = tl.fma(c1, _q80_xcol(xs, 4 * j - 3, F32)[None], o)
        o = tl.fma(c2, _q80_xcol(xs, 4 * j - 2, F32)[None], o)
        o = tl.fma(c3, _q80_xcol(xs, 4 * j - 1, F32)[None], o)
    # d (2^24 S - 128 X): two fused multiply-adds a block (the power of two is exact)
    acc = d_e * tl.fma(e, 16777216.0, -x128e[None])
    return tl.fma(d_o, tl.fma(o, 16777216.0, -x128o[None]), acc)


@triton.jit
def q80_row_dot(x_row, w32, rows, kb_start, kb_end, ROWS_T: tl.constexpr, SB: tl.constexpr,
                ASM: tl.constexpr):  # fmt: skip
    """(BLOCK_N,) float32: x_row · the program's BLOCK_N = 8 ROWS_T Q8_0 rows `rows`
    (`_row_offsets`, 32-bit units) over super-blocks (256 columns) kb_start .. kb_end, SB a
    step."""
    F32: tl.constexpr = x_row.dtype.element_ty == tl.float32
    acc = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    for kb in range(kb_start, kb_end, SB):
        xs = q80_x(x_row, kb, kb_end, SB, ASM)
        acc += q80_word_sums(q80_decode(w32, rows, kb, kb_end, ROWS_T, SB, ASM), xs, F32, ASM)
    return _rows_out(acc, ROWS_T)


@triton.jit
def q80_pair_dot(x_row, w32, rows, rows2, kb_end, ROWS_T: tl.constexpr, SB: tl.constexpr,
                 ASM: tl.constexpr):  # fmt: skip
    """`q80_row_dot` of two row sets (a gate/up GEMV's gate and up rows) in one loop from
    super-block 0, the activations loaded and summed once for both."""
    F32: tl.constexpr = x_row.dtype.element_ty == tl.float32
    acc = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc2 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    for kb in range(0, kb_end, SB):
        xs = q80_x(x_row, kb, kb_end, SB, ASM)
        acc += q80_word_sums(q80_decode(w32, rows, kb, kb_end, ROWS_T, SB, ASM), xs, F32, ASM)
        acc2 += q80_word_sums(q80_decode(w32, rows2, kb, kb_end, ROWS_T, SB, ASM), xs, F32,
                              ASM)  # fmt: skip
    return _rows_out(acc, ROWS_T), _rows_out(acc2, ROWS_T)


@triton.jit
def q80_four_rows_dot(x0, stride_xm, more, w32, rows, kb_start, kb_end, ROWS_T: tl.constexpr,
                      SB: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """Four (BLOCK_N,) float32 dots: x rows x0, x0 + stride_xm, ... · the program's Q8_0 rows
    `rows` over super-blocks kb_start .. kb_end, each decoded once for the four; x row r > 0
    only where r < `more`, else 0. One build for every call, one row too (as
    `gguf_q4k_words.q4k_four_rows_dot`: a row's bits may not depend on the batch)."""
    F32: tl.constexpr = x0.dtype.element_ty == tl.float32
    acc0 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc1 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc2 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc3 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    for kb in range(kb_start, kb_end, SB):
        dec = q80_decode(w32, rows, kb, kb_end, ROWS_T, SB, ASM)
        acc0 += q80_word_sums(dec, q80_x(x0, kb, kb_end, SB, ASM), F32, ASM)
        if 1 < more:
            acc1 += q80_word_sums(dec, q80_x(x0 + stride_xm, kb, kb_end, SB, ASM), F32, ASM)
        if 2 < more:
            acc2 += q80_word_sums(dec, q80_x(x0 + 2 * stride_xm, kb, kb_end, SB, ASM), F32,
                                  ASM)  # fmt: skip
        if 3 < more:
            acc3 += q80_word_sums(dec, q80_x(x0 + 3 * stride_xm, kb, kb_end, SB, ASM), F32,
                                  ASM)  # fmt: skip
    return (_rows_out(acc0, ROWS_T), _rows_out(acc1, ROWS_T), _rows_out(acc2, ROWS_T),
            _rows_out(acc3, ROWS_T))  # fmt: skip
