"""Triton linears of the quantized weight formats (launched from `xinfer.kernels.quant_launch`):
a linear (tiles of rows against dequantized weight tiles, `tl.dot` in float32) and its
decode forms without the dot (one or four x rows a program), and the row loop they share
with the routed-expert kernels of `quant_moe.py` (`_row_dot`). Weights are read in their
stored bytes and dequantized in registers by `quant_dequant.load_weight_tile`, then rounded
to the activation dtype as the twins do (they dequantize to it before multiplying).

Act-order int4 (`quant/act_order.py`): the weight's column j multiplies x[perm[j]]; these
kernels take x already gathered into that order (`triton/permute.py`), so they are the plain
ones. Down projections take no perm (an expert's w2 order is folded into its gate/up rows at
load)."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.gemv import four_rows, store_split_tile
from xinfer.kernels.triton.pdl import wait_for_producers
from xinfer.kernels.triton.quant_dequant import (
    load_raw_pairs,
    load_raw_tile3,
    load_raw_words,
    load_weight_pairs,
    load_weight_tile,
)


@triton.jit
def _x_tile(x_row, ks, k_end, EVEN: tl.constexpr):
    """The activations of x row `x_row` for the weight's columns `ks` (the tile's full shape)."""
    if EVEN:
        x = tl.load(x_row + ks)
    else:
        x = tl.load(x_row + ks, mask=ks < k_end, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _sums_zeros(BLOCK_N: tl.constexpr, G: tl.constexpr, GROUP_T: tl.constexpr,
                CHUNK: tl.constexpr):  # fmt: skip
    """The accumulator of `_scaled_sums`: (BLOCK_N, G), or (BLOCK_N, G, GROUP_T // CHUNK)."""
    if CHUNK == 0:
        return tl.zeros((BLOCK_N, G), dtype=tl.float32)
    else:
        return tl.zeros((BLOCK_N, G, GROUP_T // CHUNK), dtype=tl.float32)


@triton.jit
def _scaled_sums(p, sc, CHUNK: tl.constexpr):
    """A tile's products p (BLOCK_N, G, GROUP_T) with x, summed and scaled (sc (BLOCK_N, G)):
    CHUNK 0, each group's sum across the tile (threads exchange partial sums every step);
    CHUNK c, sums of c neighbouring columns (a 4-bit word's eight: in one thread), each
    scaled, kept per chunk across the steps and summed once at the end (`_sums_total`)."""
    if CHUNK == 0:
        return tl.sum(p, axis=2) * sc
    else:
        BN: tl.constexpr = p.shape[0]
        G: tl.constexpr = p.shape[1]
        T: tl.constexpr = p.shape[2]
        return tl.sum(tl.reshape(p, (BN, G, T // CHUNK, CHUNK)), axis=3) * sc[:, :, None]


@triton.jit
def _sums_total(acc, CHUNK: tl.constexpr):
    """(BLOCK_N,) float32: a `_scaled_sums` accumulator summed over its groups (and chunks)."""
    if CHUNK == 0:
        return tl.sum(acc, axis=1)
    else:
        return tl.sum(tl.sum(acc, axis=2), axis=1)


@triton.jit
def _decoded_tile(
    w_ptr, s_ptr, z_ptr, rows, k0, mask_n, k_end, stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    PACKED: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr, EVEN: tl.constexpr,
    WORD_VEC: tl.constexpr, HALF2: tl.constexpr,
):  # fmt: skip
    """(codes' values, scales) of a tile in column order: 4-bit codes by words
    (`load_raw_words`: the caller checked `quant_launch.words`, and `word_vec` for WORD_VEC),
    FP8 codes as they lie."""
    if PACKED:
        v, sc = load_raw_words(
            w_ptr, s_ptr, z_ptr, rows, k0, mask_n, k_end, stride_wn, stride_sn, stride_zn,
            FMT, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T, EVEN, WORD_VEC, HALF2,
        )  # fmt: skip
    else:
        v, sc = load_raw_tile3(
            w_ptr, s_ptr, z_ptr, rows, k0, mask_n, k_end, stride_wn, stride_sn, stride_zn,
            FMT, SCALE_BN, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T, EVEN,
        )  # fmt: skip
    return v, sc


@triton.jit
def _col_step(
    acc, x, w_ptr, s_ptr, z_ptr, rows, k0, mask_n, k_dim, stride_wn, stride_sn, stride_zn, dtype,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    PACKED: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr,
    FACTORED: tl.constexpr, EVEN: tl.constexpr, WORD_VEC: tl.constexpr, HALF2: tl.constexpr,
    CHUNK: tl.constexpr,
):  # fmt: skip
    """One step of `_row_dot`'s column-order path: `acc` plus the scaled sums (FACTORED,
    `_scaled_sums`) or the products (BLOCK_N, groups, GROUP_T) of a tile with x (its full
    shape)."""
    v, sc = _decoded_tile(
        w_ptr, s_ptr, z_ptr, rows, k0, mask_n, k_dim, stride_wn, stride_sn, stride_zn,
        FMT, SCALE_BN, SCALE_BK, HAS_ZERO, PACKED, BLOCK_K, GROUP_T, EVEN, WORD_VEC, HALF2,
    )  # fmt: skip
    if FACTORED:
        acc += _scaled_sums(v * x, sc, CHUNK)
    else:  # each weight rounded to x's dtype, as the twin (load_weight_tile3's v * s)
        acc += (v * sc[:, :, None]).to(dtype).to(tl.float32) * x
    return acc


@triton.jit
def _pair_step(
    acc, xe, xo, w_ptr, s_ptr, z_ptr, rows, k0, mask_n, k_dim, stride_wn, stride_sn, stride_zn,
    dtype,
    FMT: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_T: tl.constexpr, FACTORED: tl.constexpr,
):  # fmt: skip
    """One step of `_row_dot`'s 4-bit-bytes path: `acc` plus the group sums (FACTORED) or
    the products of the even and odd columns with xe, xo."""
    if FACTORED:
        lo, hi, sc = load_raw_pairs(
            w_ptr, s_ptr, z_ptr, rows, k0, mask_n, k_dim,
            stride_wn, stride_sn, stride_zn, FMT, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
        )  # fmt: skip
        acc += tl.sum(lo * xe + hi * xo, axis=2) * sc
    else:
        lo, hi = load_weight_pairs(
            w_ptr, s_ptr, z_ptr, rows, k0, mask_n, k_dim,
            stride_wn, stride_sn, stride_zn, FMT, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
        )  # fmt: skip
        acc += lo.to(dtype).to(tl.float32) * xe
        acc += hi.to(dtype).to(tl.float32) * xo
    return acc


@triton.jit
def _row_dot(
    x_ptr, w_ptr, s_ptr, z_ptr, offs_n, mask_n, row_offset, row_offset2, k_begin, k_dim,
    stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    PACKED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr,
    FACTORED: tl.constexpr, WORDS: tl.constexpr, EVEN: tl.constexpr, PAIR: tl.constexpr,
    WORD_VEC: tl.constexpr = 1, HALF2: tl.constexpr = False, CHUNK: tl.constexpr = 0,
):  # fmt: skip
    """A pair of (BLOCK_N,) float32 sums: x[k_begin:k_dim] · dequant(W[row_offset + offs_n,
    k_begin:k_dim]) (k_begin a multiple of BLOCK_K: a split of a linear's K, else 0), and with
    PAIR the same for the rows at row_offset2, both tiles read in one loop (a gate/up GEMV's
    gate and up halves: half the dependent iterations; each sum's arithmetic is as alone, so
    its bits are the same either way); without PAIR the second is zeros. Tiles are (BLOCK_N,
    groups, columns of a group) so that scales load once per group; 4-bit formats (PACKED)
    read whole bytes and multiply the even and odd columns of x. Each weight is rounded to
    x's dtype first, as the twin dequantizes to it; or, FACTORED, the codes' values meet x
    unscaled and each group's sum is scaled once (no per-element scale nor rounding: float32
    throughout, within the twin's tolerance rather than on its bits).

    Unpacked formats load x at the weight tile's full shape (the same values in every row),
    so each thread loads the activations of the weights it holds; a (groups, columns) load
    broadcast over the rows was redistributed through shared memory with two barriers every
    iteration (bench/sass_report.py). The 4-bit formats keep the broadcast: their even/odd
    columns at the full shape cost 2.2-2.6× the loads and +30% loop instructions (sm_90
    SASS), against 4 barriers an iteration; which is faster is for the H200 to say.

    WORDS (4-bit formats whose groups are whole 32-bit words, `quant_launch.words`): the
    codes are read a word of eight at a time and decoded two per shift-and-mask
    (`load_raw_words`), in column order and in the layout of x's full-shape load, so the
    4-bit path needs no broadcast either: NVFP4 linear's loop 197 → 148 instructions, 4 → 2
    barriers (sm_90 SASS, `bench/sass_report.py --cases linear-nvfp4`).

    EVEN (N and the K range whole tiles: `quant_launch.even`): the word and FP8 paths load
    codes and x without masks (NVFP4 linear's loop 148 → ~125 instructions)."""
    dtype = x_ptr.dtype.element_ty
    rows = offs_n + row_offset
    rows2 = offs_n + row_offset2
    g = tl.arange(0, BLOCK_K // GROUP_T)
    if WORDS or not PACKED:  # codes in column order: 4-bit by words, or FP8
        cols = g[:, None] * GROUP_T + tl.arange(0, GROUP_T)[None, :]
        cols = cols[None, :, :] + tl.zeros((BLOCK_N, 1, 1), tl.int32)  # x at the tile's shape
        if FACTORED:
            acc = _sums_zeros(BLOCK_N, BLOCK_K // GROUP_T, GROUP_T, CHUNK)
        else:
            acc = tl.zeros((BLOCK_N, BLOCK_K // GROUP_T, GROUP_T), dtype=tl.float32)
        acc2 = acc
        for k0 in range(k_begin, k_dim, BLOCK_K):
            ks = k0 + cols
            x = _x_tile(x_ptr, ks, k_dim, EVEN)
            acc = _col_step(
                acc, x, w_ptr, s_ptr, z_ptr, rows, k0, mask_n, k_dim, stride_wn, stride_sn,
                stride_zn, dtype, FMT, SCALE_BN, SCALE_BK, HAS_ZERO, PACKED, BLOCK_K, GROUP_T,
                FACTORED, EVEN, WORD_VEC, HALF2, CHUNK,
            )  # fmt: skip
            if PAIR:
                acc2 = _col_step(
                    acc2, x, w_ptr, s_ptr, z_ptr, rows2, k0, mask_n, k_dim, stride_wn, stride_sn,
                    stride_zn, dtype, FMT, SCALE_BN, SCALE_BK, HAS_ZERO, PACKED, BLOCK_K,
                    GROUP_T, FACTORED, EVEN, WORD_VEC, HALF2, CHUNK,
                )  # fmt: skip
    else:  # 4-bit codes by bytes
        pcols = g[:, None] * GROUP_T + 2 * tl.arange(0, GROUP_T // 2)[None, :]  # even columns
        if FACTORED:
            acc = tl.zeros((BLOCK_N, BLOCK_K // GROUP_T), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_N, BLOCK_K // GROUP_T, GROUP_T // 2), dtype=tl.float32)
        acc2 = acc
        for k0 in range(k_begin, k_dim, BLOCK_K):
            ke = k0 + pcols
            mask_p = ke < k_dim  # K is even for 4-bit formats: the odd column follows
            xe = tl.load(x_ptr + ke, mask=mask_p, other=0.0).to(tl.float32)[None, :, :]
            xo = tl.load(x_ptr + ke + 1, mask=mask_p, other=0.0).to(tl.float32)[None, :, :]
            acc = _pair_step(
                acc, xe, xo, w_ptr, s_ptr, z_ptr, rows, k0, mask_n, k_dim, stride_wn, stride_sn,
                stride_zn, dtype, FMT, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T, FACTORED,
            )  # fmt: skip
            if PAIR:
                acc2 = _pair_step(
                    acc2, xe, xo, w_ptr, s_ptr, z_ptr, rows2, k0, mask_n, k_dim, stride_wn,
                    stride_sn, stride_zn, dtype, FMT, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
                    FACTORED,
                )  # fmt: skip
    if FACTORED and (WORDS or not PACKED):
        out, out2 = _sums_total(acc, CHUNK), _sums_total(acc2, CHUNK)
    elif FACTORED:
        out, out2 = tl.sum(acc, axis=1), tl.sum(acc2, axis=1)
    else:
        out, out2 = tl.sum(tl.sum(acc, axis=2), axis=1), tl.sum(tl.sum(acc2, axis=2), axis=1)
    return out, out2


@triton.jit(do_not_specialize=["M", "stride_os"])
def quant_linear_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, final_ptr, count_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om, stride_fm,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_T: tl.constexpr, DOT_PRECISION: tl.constexpr, REDUCE: tl.constexpr,
):  # fmt: skip
    """grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), splits): out[split] = x @ dequant(w)^T over
    the split's K range [split * k_per_split, +k_per_split) (+ bias). Split-K launches pass a
    float32 `out` (splits, M, N); with REDUCE the tile's last split adds them in split order
    into `final`, bias included (`gemv.reduce_when_last`), otherwise they pass no bias and
    `gemv_split_reduce_kernel` follows. A row's bits depend on its x row, BLOCK_K and the
    splits only (the k order of the float32 accumulation), not on M."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_begin = split * k_per_split
    k_end = tl.minimum(K, k_begin + k_per_split)
    dtype = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        ks = k0 + offs_k
        mask_k = ks < k_end
        x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + ks[None, :]
        x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = load_weight_tile(
            w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_end, stride_wn, stride_sn, stride_zn,
            FMT, SCALE_BN, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
        )  # fmt: skip
        acc = tl.dot(x, tl.trans(w.to(dtype)), acc, input_precision=DOT_PRECISION)
    store_split_tile(
        acc, out_ptr, bias_ptr, final_ptr, count_ptr, pid_m * tl.num_programs(1) + pid_n, split,
        tl.num_programs(2), offs_m, offs_n, mask_m, mask_n, stride_os, stride_om, stride_fm,
        HAS_BIAS, REDUCE, BLOCK_M, BLOCK_N,
    )  # fmt: skip


@triton.jit(do_not_specialize=["M", "stride_os"])
def quant_linear_gemv_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, final_ptr, count_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om, stride_fm,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    PACKED: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr, FACTORED: tl.constexpr, REDUCE: tl.constexpr,
    WORDS: tl.constexpr, EVEN: tl.constexpr,
    USE_PDL: tl.constexpr = False, HALF2: tl.constexpr = False, CHUNK: tl.constexpr = 0,
):  # fmt: skip
    """grid (M, cdiv(N, BLOCK_N), splits), the decode linear without `tl.dot`: a program
    multiplies one x row by BLOCK_N rows of the weight over its split's K range
    [split * k_per_split, +k_per_split) as the MoE GEMV does (`_row_dot`: multiply-adds on
    the tile dequantized in registers), then stores as `quant_linear_kernel` does. The rows
    of x are the fastest program index, so the programs that read one weight tile run side
    by side and share it through L2. A row's bits depend on its x row, the tiles and the
    splits only — never on M."""
    wait_for_producers(USE_PDL)
    m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    k_begin = split * k_per_split
    k_end = tl.minimum(K, k_begin + k_per_split)
    acc, _ = _row_dot(
        x_ptr + m.to(tl.int64) * stride_xm, w_ptr, s_ptr, z_ptr, offs_n, mask_n, 0, 0,
        k_begin, k_end, stride_wn, stride_sn, stride_zn, FMT, SCALE_BN, SCALE_BK, HAS_ZERO,
        PACKED, BLOCK_N, BLOCK_K, GROUP_T, FACTORED, WORDS, EVEN, False, 1, HALF2, CHUNK,
    )  # fmt: skip
    offs_m = m + tl.arange(0, 1)
    store_split_tile(
        acc[None, :], out_ptr, bias_ptr, final_ptr, count_ptr, m * tl.num_programs(1) + pid_n,
        split, tl.num_programs(2), offs_m, offs_n, offs_m < M, mask_n, stride_os, stride_om,
        stride_fm, HAS_BIAS, REDUCE, 1, BLOCK_N,
    )  # fmt: skip


@triton.jit(do_not_specialize=["M", "stride_os"])
def quant_linear_rows_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, final_ptr, count_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om, stride_fm,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    PACKED: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr, REDUCE: tl.constexpr, EVEN: tl.constexpr,
    ROWS: tl.constexpr = 4,
    USE_PDL: tl.constexpr = False, HALF2: tl.constexpr = False, CHUNK: tl.constexpr = 0,
):  # fmt: skip
    """grid (cdiv(M, 4), cdiv(N, BLOCK_N), splits): the GEMV form for four rows of x a
    program: each weight tile is decoded once (FP8 codes, or 4-bit words: `load_raw_words`)
    and each row's group sums scaled once (FACTORED) into an accumulator of its own; rows
    past M skip their multiply-adds. A row's arithmetic is the same whether its neighbours
    exist or not, so its bits never depend on M; the decode is shared by four rows instead
    of paid per row (`quant_linear_gemv_kernel`). ROWS = 1 (calls of one row): rows 1-3
    compiled out, no branch in the loop, row 0's operations as in ROWS = 4."""
    wait_for_producers(USE_PDL)
    m0 = tl.program_id(0) * 4
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    k_begin = split * k_per_split
    k_end = tl.minimum(K, k_begin + k_per_split)
    g = tl.arange(0, BLOCK_K // GROUP_T)
    cols = g[:, None] * GROUP_T + tl.arange(0, GROUP_T)[None, :]
    cols = cols[None, :, :] + tl.zeros((BLOCK_N, 1, 1), tl.int32)  # x at the tile's shape
    x0 = x_ptr + m0.to(tl.int64) * stride_xm
    acc0 = _sums_zeros(BLOCK_N, BLOCK_K // GROUP_T, GROUP_T, CHUNK)
    acc1 = _sums_zeros(BLOCK_N, BLOCK_K // GROUP_T, GROUP_T, CHUNK)
    acc2 = _sums_zeros(BLOCK_N, BLOCK_K // GROUP_T, GROUP_T, CHUNK)
    acc3 = _sums_zeros(BLOCK_N, BLOCK_K // GROUP_T, GROUP_T, CHUNK)
    for k0 in range(k_begin, k_end, BLOCK_K):
        v, sc = _decoded_tile(
            w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_end, stride_wn, stride_sn, stride_zn,
            FMT, SCALE_BN, SCALE_BK, HAS_ZERO, PACKED, BLOCK_K, GROUP_T, EVEN, 1, HALF2,
        )  # fmt: skip
        ks = k0 + cols
        acc0 += _scaled_sums(v * _x_tile(x0, ks, k_end, EVEN), sc, CHUNK)
        if ROWS > 1:
            if m0 + 1 < M:
                acc1 += _scaled_sums(v * _x_tile(x0 + stride_xm, ks, k_end, EVEN), sc, CHUNK)
            if m0 + 2 < M:
                acc2 += _scaled_sums(v * _x_tile(x0 + 2 * stride_xm, ks, k_end, EVEN), sc, CHUNK)
            if m0 + 3 < M:
                acc3 += _scaled_sums(v * _x_tile(x0 + 3 * stride_xm, ks, k_end, EVEN), sc, CHUNK)
    y = four_rows(_sums_total(acc0, CHUNK), _sums_total(acc1, CHUNK), _sums_total(acc2, CHUNK),
                  _sums_total(acc3, CHUNK))  # fmt: skip
    offs_m = m0 + tl.arange(0, 4)
    store_split_tile(
        y, out_ptr, bias_ptr, final_ptr, count_ptr, (m0 // 4) * tl.num_programs(1) + pid_n,
        split, tl.num_programs(2), offs_m, offs_n, offs_m < M, mask_n, stride_os, stride_om,
        stride_fm, HAS_BIAS, REDUCE, 4, BLOCK_N,
    )  # fmt: skip
