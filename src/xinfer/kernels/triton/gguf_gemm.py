"""Triton kernels on raw GGUF blocks (launched from `xinfer.kernels.gguf_launch`): a linear
(rows of x against weight tiles dequantized in registers, `tl.dot` in float32; a 16-row
tile for decode so a row's bits do not depend on the batch) and its decode form without
the dot (one x row a program, as the MoE GEMV), and the routed-expert MLP
as GEMV kernels over (token, k) pairs for decode (multiply-adds on the dequantized tile, no
rounding of the weights) and grouped GEMMs over rows sorted by expert for prefill. Weights
are read once, in their stored bytes; experts and slots are addressed only through `ids`, so
an expert's bits do not depend on where it is held."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.fused_moe import _silu_mul, combine_when_last
from xinfer.kernels.triton.gemv import four_rows, store_split_tile
from xinfer.kernels.triton.gguf_dequant import Q6_K, Q8_0, gguf_tile, x_chunk
from xinfer.kernels.triton.gguf_q4k_words import q4k_four_rows_dot, q4k_pair_dot, q4k_row_dot
from xinfer.kernels.triton.gguf_q6k_words import q6k_four_rows_dot, q6k_pair_dot, q6k_row_dot
from xinfer.kernels.triton.gguf_q80_words import q80_four_rows_dot, q80_pair_dot, q80_row_dot
from xinfer.kernels.triton.moe_blocks import moe_block
from xinfer.kernels.triton.pdl import wait_for_producers


@triton.jit
def _dot_tile(w_ptr, row_off, kb, k_len, mask_n, dtype, BTYPE: tl.constexpr,
              BLOCK_N: tl.constexpr, SUBS: tl.constexpr):  # fmt: skip
    """(SUBS * 32, BLOCK_N) weights in the activation dtype: the B operand of tl.dot."""
    w = gguf_tile(w_ptr, row_off, kb, k_len, mask_n, BTYPE, SUBS)
    return tl.trans(tl.reshape(w, (BLOCK_N, SUBS * 32)).to(dtype))


@triton.jit(do_not_specialize=["M"])
def gguf_linear_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, final_ptr, count_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_os, stride_om, stride_fm,
    BTYPE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUBS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, REDUCE: tl.constexpr,
):  # fmt: skip
    """grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), splits): out[split] = x @ dequant(w)^T over
    K range [split * k_per_split, (split + 1) * k_per_split) (a multiple of SUBS * 32), plus
    bias with one split; with REDUCE the tile's last split adds the float32 partials into
    `final`, bias included (`gemv.reduce_when_last`). A row's bits depend on its x row, the
    tiles, the split and the k order only."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, SUBS * 32)
    mask_m = offs_m < M
    mask_n = offs_n < N
    row_off = offs_n.to(tl.int64) * stride_wn
    dtype = x_ptr.dtype.element_ty
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    kb_start = split * (k_per_split // (SUBS * 32))
    kb_end = tl.minimum(kb_start + k_per_split // (SUBS * 32), tl.cdiv(K, SUBS * 32))
    for kb in range(kb_start, kb_end):
        ks = kb * SUBS * 32 + offs_k
        x = tl.load(x_rows + ks[None, :], mask=mask_m[:, None] & (ks < K)[None, :], other=0.0)
        w = _dot_tile(w_ptr, row_off, kb, K, mask_n, dtype, BTYPE, BLOCK_N, SUBS)
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    store_split_tile(
        acc, out_ptr, bias_ptr, final_ptr, count_ptr, pid_m * tl.num_programs(1) + pid_n, split,
        tl.num_programs(2), offs_m, offs_n, mask_m, mask_n, stride_os, stride_om, stride_fm,
        HAS_BIAS, REDUCE, BLOCK_M, BLOCK_N,
    )  # fmt: skip


@triton.jit(do_not_specialize=["M"])
def gguf_linear_gemv_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, final_ptr, count_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_os, stride_om, stride_fm,
    BTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SUBS: tl.constexpr,
    REDUCE: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """grid (M, cdiv(N, BLOCK_N), splits), the decode linear without `tl.dot`: a program
    multiplies one x row by BLOCK_N weight rows over its split's K range as the MoE GEMV
    does (multiply-adds on the dequantized tile), then stores as `gguf_linear_kernel`. The
    rows of x are the fastest program index, so the programs reading one weight tile run
    side by side and share it through L2. A row's bits never depend on M."""
    wait_for_producers(USE_PDL)
    m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    row_off = offs_n.to(tl.int64) * stride_wn
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    kb_start = split * (k_per_split // (SUBS * 32))
    kb_end = tl.minimum(kb_start + k_per_split // (SUBS * 32), tl.cdiv(K, SUBS * 32))
    acc = tl.zeros((BLOCK_N, SUBS, 32), dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        acc += gguf_tile(w_ptr, row_off, kb, K, mask_n, BTYPE, SUBS) * x_chunk(
            x_row, kb, K, SUBS, BLOCK_N
        )
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    offs_m = m + tl.arange(0, 1)
    store_split_tile(
        y[None, :], out_ptr, bias_ptr, final_ptr, count_ptr, m * tl.num_programs(1) + pid_n,
        split, tl.num_programs(2), offs_m, offs_n, offs_m < M, mask_n, stride_os, stride_om,
        stride_fm, HAS_BIAS, REDUCE, 1, BLOCK_N,
    )  # fmt: skip


@triton.jit
def words_four_rows(x0, stride_xm, more, w_ptr, row0, N, stride_wn, split, k_per_split, K,
                    BTYPE: tl.constexpr, ROWS_T: tl.constexpr, SB: tl.constexpr,
                    ASM: tl.constexpr):  # fmt: skip
    """The four-row word dot of `gguf_linear_rows_kernel` (and of each segment of
    `gguf_segments.gguf_linear_segments_kernel`): x rows x0 .. x0 + 3 stride_xm (those below
    `more`) · the BLOCK_N = 8 ROWS_T rows from `row0` of the (N, row bytes) `BTYPE` rows at
    `w_ptr` (rows past N: the last, dropped at the store), over the super-blocks of `split`;
    four (BLOCK_N,) float32 sums."""
    sb_start = split * (k_per_split // 256)  # splits in whole super-blocks
    sb_end = tl.minimum(sb_start + k_per_split // 256, K // 256)
    if BTYPE == Q6_K:  # `gguf_q6k_words`: rows in 16-bit units
        y0, y1, y2, y3 = q6k_four_rows_dot(
            x0, stride_xm, more, w_ptr, (0, row0, N - 1, stride_wn // 2), sb_start, sb_end,
            ROWS_T, SB, ASM,
        )  # fmt: skip
    elif BTYPE == Q8_0:  # `gguf_q80_words`: 256 columns a step unit, rows in words
        y0, y1, y2, y3 = q80_four_rows_dot(
            x0, stride_xm, more, w_ptr.to(tl.pointer_type(tl.int32)),
            (0, row0, N - 1, stride_wn // 4), sb_start, sb_end, ROWS_T, SB, ASM,
        )  # fmt: skip
    else:
        y0, y1, y2, y3 = q4k_four_rows_dot(
            x0, stride_xm, more, w_ptr.to(tl.pointer_type(tl.int32)),
            (0, row0, N - 1, stride_wn // 4), sb_start, sb_end, ROWS_T, SB, ASM,
        )  # fmt: skip
    return y0, y1, y2, y3


@triton.jit(do_not_specialize=["M"])
def gguf_linear_rows_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, final_ptr, count_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_os, stride_om, stride_fm,
    BTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SUBS: tl.constexpr,
    REDUCE: tl.constexpr,
    USE_PDL: tl.constexpr = False, WORDS: tl.constexpr = False, ASM: tl.constexpr = False,
    ROWS_T: tl.constexpr = 1,
):  # fmt: skip
    """grid (cdiv(M, 4), cdiv(N, BLOCK_N), splits): the GEMV form for four rows of x a
    program: each weight tile is decoded once and multiplied into four accumulators, one a
    row (rows past M skip their multiply-adds). A row's arithmetic is the same whether its
    neighbours exist or not, so its bits never depend on M; the decode is shared by four
    rows instead of paid per row (`gguf_linear_gemv_kernel`). WORDS (Q4_K, Q6_K or Q8_0
    whose rows allow it: `gguf_tiles.q4k_words`, `q6k_words`, `q80_words`): the factored
    word path (`gguf_q4k_words.q4k_four_rows_dot`, `gguf_q6k_words.q6k_four_rows_dot`,
    `gguf_q80_words.q80_four_rows_dot`; SUBS / 8
    super-blocks a step, one a warp; ROWS_T rows a thread), one build for calls of one to
    four rows."""
    wait_for_producers(USE_PDL)
    m0 = tl.program_id(0) * 4
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    row_off = offs_n.to(tl.int64) * stride_wn
    x0 = x_ptr + m0.to(tl.int64) * stride_xm
    kb_start = split * (k_per_split // (SUBS * 32))
    kb_end = tl.minimum(kb_start + k_per_split // (SUBS * 32), tl.cdiv(K, SUBS * 32))
    if WORDS:
        y0, y1, y2, y3 = words_four_rows(
            x0, stride_xm, M - m0, w_ptr, pid_n * BLOCK_N, N, stride_wn, split, k_per_split, K,
            BTYPE, ROWS_T, SUBS // 8, ASM,
        )  # fmt: skip
    else:
        acc0 = tl.zeros((BLOCK_N, SUBS, 32), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_N, SUBS, 32), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_N, SUBS, 32), dtype=tl.float32)
        acc3 = tl.zeros((BLOCK_N, SUBS, 32), dtype=tl.float32)
        for kb in range(kb_start, kb_end):
            w = gguf_tile(w_ptr, row_off, kb, K, mask_n, BTYPE, SUBS)
            acc0 += w * x_chunk(x0, kb, K, SUBS, BLOCK_N)
            if m0 + 1 < M:
                acc1 += w * x_chunk(x0 + stride_xm, kb, K, SUBS, BLOCK_N)
            if m0 + 2 < M:
                acc2 += w * x_chunk(x0 + 2 * stride_xm, kb, K, SUBS, BLOCK_N)
            if m0 + 3 < M:
                acc3 += w * x_chunk(x0 + 3 * stride_xm, kb, K, SUBS, BLOCK_N)
        y0 = tl.sum(tl.sum(acc0, axis=2), axis=1)
        y1 = tl.sum(tl.sum(acc1, axis=2), axis=1)
        y2 = tl.sum(tl.sum(acc2, axis=2), axis=1)
        y3 = tl.sum(tl.sum(acc3, axis=2), axis=1)
    tile = (m0 // 4) * tl.num_programs(1) + pid_n
    y = four_rows(y0, y1, y2, y3)
    offs_m = m0 + tl.arange(0, 4)
    store_split_tile(
        y, out_ptr, bias_ptr, final_ptr, count_ptr, tile, split, tl.num_programs(2), offs_m,
        offs_n, offs_m < M, mask_n, stride_os, stride_om, stride_fm, HAS_BIAS, REDUCE, 4,
        BLOCK_N,
    )  # fmt: skip


@triton.jit
def gguf_moe_gate_up_gemv_kernel(
    x_ptr, ids_ptr, w_ptr, inter_ptr,
    hidden_dim, inter_dim,
    stride_xt, stride_we, stride_wn, stride_it,
    BTYPE: tl.constexpr, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, SUBS: tl.constexpr,
    USE_PDL: tl.constexpr = False, WORDS: tl.constexpr = False, ASM: tl.constexpr = False,
    ROWS_T: tl.constexpr = 1,
):  # fmt: skip
    """grid (T*k, cdiv(I, BLOCK_N)): inter[pair, n] = silu(x·W13[e, n]) * (x·W13[e, I + n]).
    WORDS (Q4_K, Q6_K or Q8_0 whose rows allow it: `gguf_tiles.q4k_words`, `q6k_words`,
    `q80_words`): the factored word path (`q4k_pair_dot`, `q6k_pair_dot`, `q80_pair_dot`;
    SUBS / 8 super-blocks (Q8_0: 256 columns) a step, one a
    warp; ROWS_T rows a thread; rows past I clamped to the last, dropped at the store)."""
    wait_for_producers(USE_PDL)
    pair = tl.program_id(0)
    pid_n = tl.program_id(1)
    tok = (pair // TOP_K).to(tl.int64)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < inter_dim
    gate_off = e * stride_we + offs_n.to(tl.int64) * stride_wn
    up_off = gate_off + inter_dim * stride_wn
    x_row = x_ptr + tok * stride_xt
    if WORDS:
        w32 = w_ptr.to(tl.pointer_type(tl.int32))
        gate = e * (stride_we // 4)  # rows past I: the last, dropped at the store
        rows = (gate, pid_n * BLOCK_N, inter_dim - 1, stride_wn // 4)
        rows2 = (gate + inter_dim * (stride_wn // 4), pid_n * BLOCK_N, inter_dim - 1,
                 stride_wn // 4)  # fmt: skip
        if BTYPE == Q6_K:  # `gguf_q6k_words`: rows in 16-bit units
            gate = e * (stride_we // 2)
            rows = (gate, pid_n * BLOCK_N, inter_dim - 1, stride_wn // 2)
            rows2 = (gate + inter_dim * (stride_wn // 2), pid_n * BLOCK_N, inter_dim - 1,
                     stride_wn // 2)  # fmt: skip
            g, u = q6k_pair_dot(x_row, w_ptr, rows, rows2, hidden_dim // 256, ROWS_T, SUBS // 8,
                                ASM)  # fmt: skip
        elif BTYPE == Q8_0:  # `gguf_q80_words`: rows in 32-bit words
            g, u = q80_pair_dot(x_row, w32, rows, rows2, hidden_dim // 256, ROWS_T, SUBS // 8,
                                ASM)  # fmt: skip
        else:
            g, u = q4k_pair_dot(x_row, w32, rows, rows2, hidden_dim // 256, ROWS_T, SUBS // 8,
                                ASM)  # fmt: skip
    else:
        acc_g = tl.zeros((BLOCK_N, SUBS, 32), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_N, SUBS, 32), dtype=tl.float32)
        for kb in range(0, tl.cdiv(hidden_dim, SUBS * 32)):
            x = x_chunk(x_row, kb, hidden_dim, SUBS, BLOCK_N)
            acc_g += gguf_tile(w_ptr, gate_off, kb, hidden_dim, mask_n, BTYPE, SUBS) * x
            acc_u += gguf_tile(w_ptr, up_off, kb, hidden_dim, mask_n, BTYPE, SUBS) * x
        g = tl.sum(tl.sum(acc_g, axis=2), axis=1)
        u = tl.sum(tl.sum(acc_u, axis=2), axis=1)
    h = _silu_mul(g, u, inter_ptr.dtype.element_ty)
    tl.store(inter_ptr + pair.to(tl.int64) * stride_it + offs_n, h, mask=mask_n)


@triton.jit
def gguf_moe_down_gemv_kernel(
    inter_ptr, ids_ptr, w_ptr, y_ptr, weights_ptr, out_ptr, count_ptr,
    hidden_dim, inter_dim,
    stride_it, stride_we, stride_wn, stride_yt, stride_ot,
    BTYPE: tl.constexpr, BLOCK_N: tl.constexpr, SUBS: tl.constexpr, TOP_K: tl.constexpr,
    COMBINE: tl.constexpr,
    USE_PDL: tl.constexpr = False, WORDS: tl.constexpr = False, ASM: tl.constexpr = False,
    ROWS_T: tl.constexpr = 1,
):  # fmt: skip
    """grid (T*k, cdiv(H, BLOCK_N)): y[pair, n] = inter[pair]·W2[e, n], rounded to the dtype;
    with COMBINE the last of a token's programs sums its pairs (`combine_when_last`). WORDS:
    as the gate/up kernel's (`gguf_q4k_words.q4k_row_dot`)."""
    wait_for_producers(USE_PDL)
    pair = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hidden_dim
    row_off = e * stride_we + offs_n.to(tl.int64) * stride_wn
    a_row = inter_ptr + pair * stride_it
    if WORDS:
        w32 = w_ptr.to(tl.pointer_type(tl.int32))
        rows = (e * (stride_we // 4), pid_n * BLOCK_N, hidden_dim - 1, stride_wn // 4)
        if BTYPE == Q6_K:  # `gguf_q6k_words`: rows in 16-bit units
            rows = (e * (stride_we // 2), pid_n * BLOCK_N, hidden_dim - 1, stride_wn // 2)
            y = q6k_row_dot(a_row, w_ptr, rows, 0, inter_dim // 256, ROWS_T, SUBS // 8, ASM)
        elif BTYPE == Q8_0:  # `gguf_q80_words`: rows in 32-bit words
            y = q80_row_dot(a_row, w32, rows, 0, inter_dim // 256, ROWS_T, SUBS // 8, ASM)
        else:
            y = q4k_row_dot(a_row, w32, rows, 0, inter_dim // 256, ROWS_T, SUBS // 8, ASM)
    else:
        acc = tl.zeros((BLOCK_N, SUBS, 32), dtype=tl.float32)
        for kb in range(0, tl.cdiv(inter_dim, SUBS * 32)):
            a = x_chunk(a_row, kb, inter_dim, SUBS, BLOCK_N)
            acc += gguf_tile(w_ptr, row_off, kb, inter_dim, mask_n, BTYPE, SUBS) * a
        y = tl.sum(tl.sum(acc, axis=2), axis=1)
    y = y.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + pair * stride_yt + offs_n, y, mask=mask_n)
    if COMBINE:
        combine_when_last(
            y_ptr, weights_ptr, out_ptr, count_ptr, pair, pid_n, tl.num_programs(1), offs_n,
            mask_n, stride_yt, stride_ot, TOP_K,
        )  # fmt: skip


@triton.jit
def gguf_moe_gate_up_grouped_kernel(
    x_ptr, sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, w_ptr, inter_ptr,
    num_pairs, hidden_dim, inter_dim,
    stride_xt, stride_we, stride_wn, stride_it,
    BTYPE: tl.constexpr, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SUBS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """grid (max_blocks * cdiv(I, BLOCK_N),): one BLOCK_M tile of rows sharing one id
    (`moe_align.align_pairs`); padding rows hold `num_pairs`. Writes inter[pair]."""
    live, e, pairs, mask_m, offs_n, mask_n = moe_block(
        sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, num_pairs, inter_dim, BLOCK_M, BLOCK_N
    )
    if not live:
        return
    toks = (pairs // TOP_K).to(tl.int64)
    offs_k = tl.arange(0, SUBS * 32)
    gate_off = e * stride_we + offs_n.to(tl.int64) * stride_wn
    up_off = gate_off + inter_dim * stride_wn
    dtype = x_ptr.dtype.element_ty
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(hidden_dim, SUBS * 32)):
        ks = kb * SUBS * 32 + offs_k
        a_ptrs = x_ptr + toks[:, None] * stride_xt + ks[None, :]
        a = tl.load(a_ptrs, mask=mask_m[:, None] & (ks < hidden_dim)[None, :], other=0.0)
        bg = _dot_tile(w_ptr, gate_off, kb, hidden_dim, mask_n, dtype, BTYPE, BLOCK_N, SUBS)
        acc_g = tl.dot(a, bg, acc_g, input_precision=DOT_PRECISION)
        bu = _dot_tile(w_ptr, up_off, kb, hidden_dim, mask_n, dtype, BTYPE, BLOCK_N, SUBS)
        acc_u = tl.dot(a, bu, acc_u, input_precision=DOT_PRECISION)
    h = _silu_mul(acc_g, acc_u, inter_ptr.dtype.element_ty)
    out_ptrs = inter_ptr + pairs.to(tl.int64)[:, None] * stride_it + offs_n[None, :]
    tl.store(out_ptrs, h, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def gguf_moe_down_grouped_kernel(
    inter_ptr, sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, w_ptr, y_ptr,
    num_pairs, hidden_dim, inter_dim,
    stride_it, stride_we, stride_wn, stride_yt,
    BTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUBS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """grid (max_blocks * cdiv(H, BLOCK_N),): y[pair] = inter[pair] @ dequant(W2[e])^T."""
    live, e, pairs, mask_m, offs_n, mask_n = moe_block(
        sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, num_pairs, hidden_dim, BLOCK_M, BLOCK_N
    )
    if not live:
        return
    rows = pairs.to(tl.int64)
    offs_k = tl.arange(0, SUBS * 32)
    row_off = e * stride_we + offs_n.to(tl.int64) * stride_wn
    dtype = inter_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(inter_dim, SUBS * 32)):
        ks = kb * SUBS * 32 + offs_k
        a_ptrs = inter_ptr + rows[:, None] * stride_it + ks[None, :]
        a = tl.load(a_ptrs, mask=mask_m[:, None] & (ks < inter_dim)[None, :], other=0.0)
        b = _dot_tile(w_ptr, row_off, kb, inter_dim, mask_n, dtype, BTYPE, BLOCK_N, SUBS)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    y_ptrs = y_ptr + rows[:, None] * stride_yt + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
