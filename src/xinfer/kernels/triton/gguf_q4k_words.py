"""GGUF Q4_K decode GEMVs by 32-bit words, factored: the loops of the MoE gate/up and down
GEMVs and of the four-row decode linear (`gguf_gemm.py`, WORDS) where `gguf_tiles.q4k_words`
allows them (Q4K_WORDS).

A Q4_K super-block of 256 weights is 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales
and mins, then qs[128], whose byte 32 g + j holds weight j of sub-block 2 g in its low
nibble and weight j of sub-block 2 g + 1 in its high nibble. Sub-block s holds
(d sc_s) q - dmin m_s, so a row's dot with x over it is

    (d sc_s) S_s - (dmin m_s) X_s,   S_s = sum_j q_j x_(32 s + j),   X_s = sum_j x_(32 s + j),

each sum in float32 (the products q x are exact), scaled once per (row, sub-block); X does
not depend on the row. The result is not the twin's bits (the twin rounds each weight, then
sums the products): float32 throughout, within the twin's tolerance, as the int4 FACTORED
GEMVs; deterministic, a row's bits from its own operations only (not the batch, not the
slot that holds an expert).

Tiles. A warp's lanes hold 8 rows x the 4 pairs g of a super-block; each lane the eight qs
words of its pair (two 16-byte loads: qs starts 16 bytes into the block, and rows, experts
and the base start on 16-byte boundaries, which the launcher checks) and the 16-byte block
header, so both sub-blocks' sums and scales are its own: no reduction across lanes in the
loop, the 4 pairs of a row summed once after it. ROWS_T rows more sit in each thread's
registers (BLOCK_N = 8 ROWS_T) and share the activations it loads and converts; SB warps
read SB super-blocks a step (K split between them, summed once at the end). Every load is a
flat (rows, 4 words) tile (`_flat`) reshaped after, so that lanes, warps and registers get
the same dims in Triton 3.6 and 3.9, and the activations load at the codes' layout, 16
bytes a load: sm_90 SASS (`bench/sass_report.py --cases gguf-q4_k,linear-gguf-q4_k`, both
versions) shows no shared memory, barrier or spill in the loops, and 0.120 / 0.119 / 0.133
warp instructions a weight (MoE gate/up, down, one-row linear at the launcher's tiles)
where the byte path takes 0.354 / 0.400 / 0.746 (3.6: 0.366 / 0.408 / 0.754).

Decode: the nibbles at bits 0-3 and 16-19 of a word, `w & 0x000F000F`, are bytes 0 and 2's
low nibbles as an fp16 pair of subnormals q 2^-24, converted to float32 exactly one an
instruction; `w & 0x00F000F0` the high nibbles (the odd sub-block) as 16 q 2^-24; `w >> 8`
the same for bytes 1 and 3. The powers of two go into the scales. A sub-block's 32 products
sum in two chains of fused multiply-adds; X is summed once a step for all rows: 8 of the
64 activations of a pair by each of its 8 lanes, then shuffles."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.quant_dequant import _half_hi, _half_lo

SUPER_WORDS = tl.constexpr(36)  # 144 bytes a super-block


@triton.jit
def _halves(w, ASM: tl.constexpr):
    """The fp16 halves of int32 words as float32 (low, high). ASM: one conversion each from
    the word's halves (inline PTX); the plain ops convert the same values, but LLVM packs the
    halves of two words into one register first (two PRMT a word, sm_90 SASS)."""
    if ASM:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
            "=f,=f,r", [w], dtype=(tl.float32, tl.float32), is_pure=True, pack=1,
        )  # fmt: skip
    else:
        lo = _half_lo(w)
        hi = _half_hi(w)
    return lo, hi


@triton.jit
def _bf16_lo(w):
    return (w << 16).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_hi(w):
    return (w & -65536).to(tl.float32, bitcast=True)  # (0xFFFF0000 as an int32)


@triton.jit
def _eight(t):
    """The eight tensors t[..., h, a, b] of a thread's three last dims (2, 2, 2)."""
    t0, t1 = tl.split(t)
    t00, t01 = tl.split(t0)
    t10, t11 = tl.split(t1)
    t000, t001 = tl.split(t00)
    t010, t011 = tl.split(t01)
    t100, t101 = tl.split(t10)
    t110, t111 = tl.split(t11)
    return t000, t001, t010, t011, t100, t101, t110, t111


@triton.jit
def _x_tiles(c0, c1, c2, c3):
    """Four (2 a, 2 h, SB, 8, 4 g, 2 b) activation tiles → their eights (SB, 8, 4 g)."""
    return (_eight(tl.permute(c0, (2, 3, 4, 1, 0, 5))), _eight(tl.permute(c1, (2, 3, 4, 1, 0, 5))),
            _eight(tl.permute(c2, (2, 3, 4, 1, 0, 5))),
            _eight(tl.permute(c3, (2, 3, 4, 1, 0, 5))))  # fmt: skip


@triton.jit
def _b_last(t):
    return tl.permute(t, (1, 2, 3, 4, 5, 0))


@triton.jit
def _flat(NR: tl.constexpr, SB: tl.constexpr):
    """The indices (outer, s, ln, g), each (NR * SB * 32, 1), of a flat tile whose row i is
    ((outer * SB + s) * 8 + ln) * 4 + g. Every load is such a (rows, 4 words) tile, reshaped
    after: a blocked layout gives a dim's low index bits to the lanes, then to the warps,
    then to registers, so g and ln land in lanes, s in warps and `outer` in a thread's
    registers in every Triton version. (Loaded at the many-dim shape instead, the dims of
    equal contiguity are ordered one way by Triton 3.9's coalescing and the other way by
    3.6's: in 3.6 the registers' dims took the lanes, and the loop converted layouts through
    shared memory, 168 barriers a step, sm_90 SASS.)"""
    i = tl.arange(0, NR * SB * 32)[:, None]
    return i // (SB * 32), (i // 32) % SB, (i // 4) % 8, i % 4


@triton.jit
def _steps(s, kb, kb_end):
    """Super-block kb + s of the warps s, clamped to the range's last, and whether it is in it."""
    return tl.minimum(kb + s, kb_end - 1), kb + s < kb_end


@triton.jit
def _row_offsets(rows, r, ln):
    """Offsets of rows r * 8 + ln of a program, in the units of `rows` (32-bit words here,
    16-bit halves in `gguf_q6k_words`): (base, first, last, stride), row n at
    base + min(first + n, last) * stride: rows past the weight's read its last, their sums
    dropped at the store."""
    base, first, last, stride = rows
    return base + tl.minimum(first + r * 8 + ln, last).to(tl.int64) * stride


@triton.jit
def q4k_x(x_row, kb, kb_end, SB: tl.constexpr, ASM: tl.constexpr):
    """The activations of super-blocks kb .. kb + SB (one a warp; clamped to kb_end - 1), the
    same for every row: for each of the even and the odd sub-blocks of the pairs g, four
    float32 tiles of column 64 g + 16 h + 8 a + 4 b + c (c = 0..3; the odd: + 32), each as
    its eight (SB, 8, 4 g) (`_eight` of (h, a, b)); and their sums X (SB, 8, 4) of the even
    and the odd sub-blocks. Loaded 16 bytes at a time by the lanes that hold the codes of
    those columns (`q4k_decode`); bf16/fp16 as 32-bit words of two, converted a half an
    instruction."""
    c = tl.arange(0, 4)[None, :]
    if x_row.dtype.element_ty == tl.float32:  # (2 b, 2 a, 2 h, SB, 8, 4 g, 4 c)
        o, s, _, g = _flat(8, SB)
        kbs, _ = _steps(s, kb, kb_end)
        cols = kbs * 256 + 64 * g + 16 * (o % 2) + 8 * ((o // 2) % 2) + 4 * (o // 4) + c
        cols = tl.max_contiguous(tl.multiple_of(cols, [1, 4]), [1, 4])
        xe = tl.reshape(tl.load(x_row + cols), (2, 2, 2, SB, 8, 4, 2, 2))
        xo = tl.reshape(tl.load(x_row + cols + 32), (2, 2, 2, SB, 8, 4, 2, 2))
        e02, e13 = tl.split(xe)  # columns 4 b + (0, 2), 4 b + (1, 3)
        e0, e2 = tl.split(e02)
        e1, e3 = tl.split(e13)
        o02, o13 = tl.split(xo)
        o0, o2 = tl.split(o02)
        o1, o3 = tl.split(o13)
        # → (2 a, 2 h, SB, 8, 4 g, 2 b) as the 16-bit path's
        e0, e1, e2, e3 = _b_last(e0), _b_last(e1), _b_last(e2), _b_last(e3)
        o0, o1, o2, o3 = _b_last(o0), _b_last(o1), _b_last(o2), _b_last(o3)
    else:  # (2 a, 2 h, SB, 8, 4 g, 4 words): words of columns 2 c, 2 c + 1
        o, s, _, g = _flat(4, SB)
        kbs, _ = _steps(s, kb, kb_end)
        words = kbs * 128 + 32 * g + 8 * (o % 2) + 4 * (o // 2) + c
        words = tl.max_contiguous(tl.multiple_of(words, [1, 4]), [1, 4])
        x32 = x_row.to(tl.pointer_type(tl.int32))
        we = tl.reshape(tl.load(x32 + words), (2, 2, SB, 8, 4, 2, 2))
        wo = tl.reshape(tl.load(x32 + words + 16), (2, 2, SB, 8, 4, 2, 2))
        e01, e23 = tl.split(we)  # columns 4 b + (0, 1), 4 b + (2, 3)
        o01, o23 = tl.split(wo)
        if x_row.dtype.element_ty == tl.bfloat16:
            e0, e1, e2, e3 = _bf16_lo(e01), _bf16_hi(e01), _bf16_lo(e23), _bf16_hi(e23)
            o0, o1, o2, o3 = _bf16_lo(o01), _bf16_hi(o01), _bf16_lo(o23), _bf16_hi(o23)
        else:
            e0, e1 = _halves(e01, ASM)
            e2, e3 = _halves(e23, ASM)
            o0, o1 = _halves(o01, ASM)
            o2, o3 = _halves(o23, ASM)
    xe = _x_tiles(e0, e1, e2, e3)
    xo = _x_tiles(o0, o1, o2, o3)
    se, so = _x_sums(x_row, kb, kb_end, SB, ASM)
    return xe, xo, se, so


@triton.jit
def _x_sums(x_row, kb, kb_end, SB: tl.constexpr, ASM: tl.constexpr):
    """X (SB, 8, 4) of the even and the odd sub-blocks of the pairs g: each of a pair's eight
    lanes sums 8 of its 64 activations (a 16-byte load of its own: the repeats of the tiles'
    loads hit L1), then the lanes of each half add theirs by shuffles; the same in every lane
    (its rows). Each lane summing all 64 it holds took 62 adds (sm_90 SASS)."""
    c = tl.arange(0, 4)[None, :]
    lane = tl.arange(0, 8)[None, :, None]  # [s, l, g]: columns 64 g + 8 l .. + 8
    if x_row.dtype.element_ty == tl.float32:  # (2 halves, SB, 8, 4 g, 4)
        o, s, ln, g = _flat(2, SB)
        kbs, _ = _steps(s, kb, kb_end)
        cols = kbs * 256 + 64 * g + 8 * ln + 4 * o + c
        cols = tl.max_contiguous(tl.multiple_of(cols, [1, 4]), [1, 4])
        part = tl.sum(tl.sum(tl.reshape(tl.load(x_row + cols), (2, SB, 8, 4, 4)), 4), 0)
    else:  # (SB, 8, 4 g, 4 words)
        _, s, ln, g = _flat(1, SB)
        kbs, _ = _steps(s, kb, kb_end)
        words = kbs * 128 + 32 * g + 4 * ln + c
        words = tl.max_contiguous(tl.multiple_of(words, [1, 4]), [1, 4])
        x32 = x_row.to(tl.pointer_type(tl.int32))
        wx = tl.reshape(tl.load(x32 + words), (SB, 8, 4, 4))
        if x_row.dtype.element_ty == tl.bfloat16:
            part = tl.sum(_bf16_lo(wx) + _bf16_hi(wx), 3)
        else:
            lo, hi = _halves(wx, ASM)
            part = tl.sum(lo + hi, 3)
    se = tl.sum(tl.where(lane < 4, part, 0.0), 1)
    so = tl.sum(tl.where(lane < 4, 0.0, part), 1)
    zero = tl.zeros((1, 8, 1), tl.float32)
    return se[:, None, :] + zero, so[:, None, :] + zero


@triton.jit
def q4k_decode(w32, rows, kb, kb_end, ROWS_T: tl.constexpr, SB: tl.constexpr,
               ASM: tl.constexpr):  # fmt: skip
    """Super-blocks kb .. kb + SB (one a warp; clamped to kb_end - 1, those past it counting
    as 0) of the program's ROWS_T x 8 rows `rows` (`_row_offsets`) of the int32 pointer `w32`:
    their codes as float32, (ROWS_T, SB, 8, 4 g) each, at `q4k_x`'s order: four tiles of
    eight of the even sub-blocks (q 2^-24) and of the odd ones (q 2^-20); and the scales
    (ROWS_T, SB, 8, 4) of each pair's even and odd sub-blocks that undo those powers of two:
    d sc 2^24, d sc 2^20, dmin m, dmin m."""
    c = tl.arange(0, 4)[None, :]
    # the header, one 16-byte load a (row, pair): d | dmin << 16, scales[0:4], [4:8], [8:12]
    r, s, ln, _ = _flat(ROWS_T, SB)
    kbs, valid = _steps(s, kb, kb_end)
    hoffs = _row_offsets(rows, r, ln) + kbs * SUPER_WORDS + c
    hoffs = tl.max_contiguous(tl.multiple_of(hoffs, [1, 4]), [1, 4])
    if SB > 1:  # a step past the range: d = dmin = 0
        head = tl.load(w32 + hoffs, mask=valid, other=0)
    else:
        head = tl.load(w32 + hoffs)
    h02, h13 = tl.split(tl.reshape(head, (ROWS_T, SB, 8, 4, 2, 2)))
    h0, h2 = tl.split(h02)
    h1, h3 = tl.split(h13)
    d = _half_lo(h0)
    dmin = _half_hi(h0)
    # sub-blocks 0-3: sc = scales[s] & 63, m = scales[s + 4] & 63; 4-7: the low / high nibble
    # of scales[s + 4] and the top two bits of scales[s - 4] / scales[s] (ggml's
    # get_scale_min_k4), four at once; pair g's two are bytes 2 (g % 2) and 2 (g % 2) + 1
    g = tl.arange(0, 4)[None, None, None, :]
    low = g < 2
    shift = (g % 2) * 16
    sc = tl.where(low, h1 & 0x3F3F3F3F, (h3 & 0x0F0F0F0F) | ((h1 >> 2) & 0x30303030)) >> shift
    mn = tl.where(low, h2 & 0x3F3F3F3F, ((h3 >> 4) & 0x0F0F0F0F) | ((h2 >> 2) & 0x30303030))
    mn = mn >> shift
    d = d * 16777216.0  # 2^24
    ds_e = d * (sc & 255).to(tl.float32)
    ds_o = (d * 0.0625) * ((sc >> 8) & 255).to(tl.float32)
    dm_e = dmin * (mn & 255).to(tl.float32)
    dm_o = dmin * ((mn >> 8) & 255).to(tl.float32)
    # qs words: (r, 2 h, SB, 8, 4 g, 4 j): word 4 h + j of pair g (bytes 16 h + 4 j .. + 3)
    o, s, ln, g4 = _flat(2 * ROWS_T, SB)
    kbs, _ = _steps(s, kb, kb_end)
    woffs = _row_offsets(rows, o // 2, ln) + kbs * SUPER_WORDS + 4 + 8 * g4 + 4 * (o % 2) + c
    woffs = tl.max_contiguous(tl.multiple_of(woffs, [1, 4]), [1, 4])
    w = tl.load(w32 + woffs)
    # → (r, s, 8, 4 g, 2 h, 2 a, 2 b), j = 2 a + b: the dims a thread holds last (its
    # registers permuted, no data moved)
    w = tl.permute(tl.reshape(w, (ROWS_T, 2, SB, 8, 4, 2, 2)), (0, 2, 3, 4, 1, 5, 6))
    # the nibbles of bytes 0 and 2 (columns c, c + 2) at bits 0 and 16, bytes 1 and 3 (c + 1,
    # c + 3) shifted there: subnormal fp16 pairs q 2^-24 (exact in float32); the high nibbles
    # at bits 4 and 20: 16 q 2^-24
    t = w >> 8
    v0, v2 = _halves(w & 0x000F000F, ASM)
    v1, v3 = _halves(t & 0x000F000F, ASM)
    u0, u2 = _halves(w & 0x00F000F0, ASM)
    u1, u3 = _halves(t & 0x00F000F0, ASM)
    ve = (_eight(v0), _eight(v1), _eight(v2), _eight(v3))
    vo = (_eight(u0), _eight(u1), _eight(u2), _eight(u3))
    return ve, vo, ds_e, ds_o, dm_e, dm_o


@triton.jit
def _dot32(vs, xs):
    """sum_i,c vs[c][i] xs[c][i] (each (ROWS_T, SB, 8, 4) by (SB, 8, 4)): two chains
    of sixteen fused multiply-adds, then their sum."""
    p = vs[0][0] * xs[0][0][None]
    q = vs[0][4] * xs[0][4][None]
    for c in tl.static_range(1, 4):
        p = tl.fma(vs[c][0], xs[c][0][None], p)
        q = tl.fma(vs[c][4], xs[c][4][None], q)
    for i in tl.static_range(1, 4):
        for c in tl.static_range(0, 4):
            p = tl.fma(vs[c][i], xs[c][i][None], p)
            q = tl.fma(vs[c][i + 4], xs[c][i + 4][None], q)
    return p + q


@triton.jit
def q4k_word_sums(dec, xs):
    """(ROWS_T, SB, 8, 4) float32: each row's dot over each pair's two sub-blocks,
    (d sc) S - (dmin m) X, of decoded super-blocks (`q4k_decode`) with their activations
    (`q4k_x`), all within a thread."""
    ve, vo, ds_e, ds_o, dm_e, dm_o = dec
    xe, xo, se, so = xs
    return (ds_e * _dot32(ve, xe) - dm_e * se[None] + ds_o * _dot32(vo, xo)
            - dm_o * so[None])  # fmt: skip


@triton.jit
def _rows_out(acc, ROWS_T: tl.constexpr):
    """(ROWS_T, SB, 8, 4) partial sums → (BLOCK_N,): over the last dim (the pairs here, the
    quarters in `gguf_q6k_words`), then the warps."""
    return tl.reshape(tl.sum(tl.sum(acc, axis=3), axis=1), (ROWS_T * 8,))


@triton.jit
def q4k_row_dot(x_row, w32, rows, kb_start, kb_end, ROWS_T: tl.constexpr, SB: tl.constexpr,
                ASM: tl.constexpr):  # fmt: skip
    """(BLOCK_N,) float32: x_row · the program's BLOCK_N = 8 ROWS_T Q4_K rows `rows`
    (`_row_offsets`) over super-blocks kb_start .. kb_end, SB a step (one a warp)."""
    acc = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    for kb in range(kb_start, kb_end, SB):
        xs = q4k_x(x_row, kb, kb_end, SB, ASM)
        acc += q4k_word_sums(q4k_decode(w32, rows, kb, kb_end, ROWS_T, SB, ASM), xs)
    return _rows_out(acc, ROWS_T)


@triton.jit
def q4k_pair_dot(x_row, w32, rows, rows2, kb_end, ROWS_T: tl.constexpr, SB: tl.constexpr,
                 ASM: tl.constexpr):  # fmt: skip
    """`q4k_row_dot` of two row sets (a gate/up GEMV's gate and up rows) in one loop from
    super-block 0, the activations loaded and summed once for both."""
    acc = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc2 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    for kb in range(0, kb_end, SB):
        xs = q4k_x(x_row, kb, kb_end, SB, ASM)
        acc += q4k_word_sums(q4k_decode(w32, rows, kb, kb_end, ROWS_T, SB, ASM), xs)
        acc2 += q4k_word_sums(q4k_decode(w32, rows2, kb, kb_end, ROWS_T, SB, ASM), xs)
    return _rows_out(acc, ROWS_T), _rows_out(acc2, ROWS_T)


@triton.jit
def q4k_four_rows_dot(x0, stride_xm, more, w32, rows, kb_start, kb_end, ROWS_T: tl.constexpr,
                      SB: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """Four (BLOCK_N,) float32 dots: x rows x0, x0 + stride_xm, ... · the program's Q4_K rows
    `rows` over super-blocks kb_start .. kb_end, each super-block decoded once for the four;
    x row r > 0 only where r < `more` (the call's rows from x0 on), else 0. One build for
    every call, one row too: a build with rows 1-3 compiled out gave row 0 other float32
    sums (H100, 2026-12-07: one output of 2,048 a bf16 ulp apart after the bias at 2048 x
    4096), so a row's bits would depend on the batch."""
    acc0 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc1 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc2 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    acc3 = tl.zeros((ROWS_T, SB, 8, 4), dtype=tl.float32)
    for kb in range(kb_start, kb_end, SB):
        dec = q4k_decode(w32, rows, kb, kb_end, ROWS_T, SB, ASM)
        acc0 += q4k_word_sums(dec, q4k_x(x0, kb, kb_end, SB, ASM))
        if 1 < more:
            acc1 += q4k_word_sums(dec, q4k_x(x0 + stride_xm, kb, kb_end, SB, ASM))
        if 2 < more:
            acc2 += q4k_word_sums(dec, q4k_x(x0 + 2 * stride_xm, kb, kb_end, SB, ASM))
        if 3 < more:
            acc3 += q4k_word_sums(dec, q4k_x(x0 + 3 * stride_xm, kb, kb_end, SB, ASM))
    return (_rows_out(acc0, ROWS_T), _rows_out(acc1, ROWS_T), _rows_out(acc2, ROWS_T),
            _rows_out(acc3, ROWS_T))  # fmt: skip
