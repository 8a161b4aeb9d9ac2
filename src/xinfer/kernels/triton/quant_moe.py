"""Triton kernels of the quantized formats' routed-expert MLP (launched from
`xinfer.kernels.quant_launch`): GEMV kernels over (token, k) pairs for decode, on the row
loop of the linears (`quant_gemm._row_dot`), and grouped GEMMs over rows sorted by expert
for prefill. Experts and slots are addressed only through `ids`, so an expert's bits do not
depend on where it is held. Act-order int4: the gate/up kernels take x rows already gathered
into each pair's expert order (`triton/permute.py`, with TOP_K 1); the down projections take
none (folded into gate/up's rows at load)."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.fused_moe import _silu_mul, combine_when_last
from xinfer.kernels.triton.moe_blocks import moe_block
from xinfer.kernels.triton.pdl import wait_for_producers
from xinfer.kernels.triton.quant_dequant import load_weight_tile
from xinfer.kernels.triton.quant_gemm import _row_dot


@triton.jit
def quant_moe_gate_up_gemv_kernel(
    x_ptr, ids_ptr, w_ptr, s_ptr, z_ptr, inter_ptr,
    hidden_dim, inter_dim,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_ze, stride_zn, stride_it,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    PACKED: tl.constexpr, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_T: tl.constexpr, FACTORED: tl.constexpr, WORDS: tl.constexpr, EVEN: tl.constexpr,
    JOINED: tl.constexpr,
    USE_PDL: tl.constexpr = False, WORD_VEC: tl.constexpr = 1, HALF2: tl.constexpr = False,
    CHUNK: tl.constexpr = 0,
):  # fmt: skip
    """grid (T*k, cdiv(I, BLOCK_N)): inter[pair, n] = silu(x·W13[e, n]) * (x·W13[e, I + n])
    with x row pair // TOP_K (act-order codes: rows gathered a pair, TOP_K 1);
    JOINED reads the gate and up tiles in one loop (half the dependent iterations), otherwise
    one loop after the other. Each sum's arithmetic is the same: same bits."""
    wait_for_producers(USE_PDL)
    pair = tl.program_id(0)
    pid_n = tl.program_id(1)
    tok = (pair // TOP_K).to(tl.int64)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < inter_dim
    w_e, s_e, z_e = w_ptr + e * stride_we, s_ptr + e * stride_se, z_ptr + e * stride_ze
    x_row = x_ptr + tok * stride_xt
    if JOINED:  # gate and up tiles in one loop
        g, u = _row_dot(
            x_row, w_e, s_e, z_e, offs_n, mask_n, 0, inter_dim, 0, hidden_dim, stride_wn,
            stride_sn, stride_zn, FMT, SCALE_BN, SCALE_BK, HAS_ZERO, PACKED, BLOCK_N, BLOCK_K,
            GROUP_T, FACTORED, WORDS, EVEN, True, WORD_VEC, HALF2, CHUNK,
        )  # fmt: skip
    else:
        g, _ = _row_dot(
            x_row, w_e, s_e, z_e, offs_n, mask_n, 0, 0, 0, hidden_dim, stride_wn, stride_sn,
            stride_zn, FMT, SCALE_BN, SCALE_BK, HAS_ZERO, PACKED, BLOCK_N, BLOCK_K, GROUP_T,
            FACTORED, WORDS, EVEN, False, WORD_VEC, HALF2, CHUNK,
        )  # fmt: skip
        u, _ = _row_dot(
            x_row, w_e, s_e, z_e, offs_n, mask_n, inter_dim, 0, 0, hidden_dim, stride_wn,
            stride_sn, stride_zn, FMT, SCALE_BN, SCALE_BK, HAS_ZERO, PACKED, BLOCK_N, BLOCK_K,
            GROUP_T, FACTORED, WORDS, EVEN, False, WORD_VEC, HALF2, CHUNK,
        )  # fmt: skip
    h = _silu_mul(g, u, inter_ptr.dtype.element_ty)
    tl.store(inter_ptr + pair.to(tl.int64) * stride_it + offs_n, h, mask=mask_n)


@triton.jit
def quant_moe_down_gemv_kernel(
    inter_ptr, ids_ptr, w_ptr, s_ptr, z_ptr, y_ptr, weights_ptr, out_ptr, count_ptr,
    hidden_dim, inter_dim,
    stride_it, stride_we, stride_wn, stride_se, stride_sn, stride_ze, stride_zn, stride_yt,
    stride_ot,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    PACKED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr,
    FACTORED: tl.constexpr, TOP_K: tl.constexpr, COMBINE: tl.constexpr, WORDS: tl.constexpr,
    EVEN: tl.constexpr,
    USE_PDL: tl.constexpr = False, WORD_VEC: tl.constexpr = 1, HALF2: tl.constexpr = False,
    CHUNK: tl.constexpr = 0,
):  # fmt: skip
    """grid (T*k, cdiv(H, BLOCK_N)): y[pair, n] = inter[pair]·W2[e, n] in the dtype; with
    COMBINE the last of a token's programs sums its pairs into out (`combine_when_last`)."""
    wait_for_producers(USE_PDL)
    pair = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hidden_dim
    w_e, s_e, z_e = w_ptr + e * stride_we, s_ptr + e * stride_se, z_ptr + e * stride_ze
    y, _ = _row_dot(
        inter_ptr + pair * stride_it, w_e, s_e, z_e, offs_n, mask_n, 0, 0, 0, inter_dim,
        stride_wn, stride_sn, stride_zn, FMT, SCALE_BN, SCALE_BK, HAS_ZERO, PACKED, BLOCK_N,
        BLOCK_K, GROUP_T, FACTORED, WORDS, EVEN, False, WORD_VEC, HALF2, CHUNK,
    )  # fmt: skip
    tl.store(y_ptr + pair * stride_yt + offs_n, y.to(y_ptr.dtype.element_ty), mask=mask_n)
    if COMBINE:
        combine_when_last(
            y_ptr, weights_ptr, out_ptr, count_ptr, pair, pid_n, tl.num_programs(1), offs_n,
            mask_n, stride_yt, stride_ot, TOP_K,
        )  # fmt: skip


@triton.jit
def quant_moe_gate_up_grouped_kernel(
    x_ptr, sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, w_ptr, s_ptr, z_ptr, inter_ptr,
    num_pairs, hidden_dim, inter_dim,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_ze, stride_zn, stride_it,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_T: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """grid (max_blocks * cdiv(I, BLOCK_N),): one BLOCK_M tile of rows sharing one id; x row
    pair // TOP_K (act-order codes: a row a pair already in its expert's column order,
    `triton/permute.py`, with TOP_K 1)."""
    live, e, pairs, mask_m, offs_n, mask_n = moe_block(
        sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, num_pairs, inter_dim, BLOCK_M, BLOCK_N
    )
    if not live:
        return
    toks = (pairs // TOP_K).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    w_e, s_e, z_e = w_ptr + e * stride_we, s_ptr + e * stride_se, z_ptr + e * stride_ze
    dtype = x_ptr.dtype.element_ty
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden_dim, BLOCK_K):
        ks = k0 + offs_k
        mask_k = ks < hidden_dim
        a_ptrs = x_ptr + toks[:, None] * stride_xt + ks[None, :]
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        wg = load_weight_tile(
            w_e, s_e, z_e, offs_n, k0, mask_n, hidden_dim, stride_wn, stride_sn, stride_zn,
            FMT, SCALE_BN, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
        )  # fmt: skip
        wu = load_weight_tile(
            w_e, s_e, z_e, offs_n + inter_dim, k0, mask_n, hidden_dim, stride_wn, stride_sn,
            stride_zn, FMT, SCALE_BN, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
        )  # fmt: skip
        acc_g = tl.dot(a, tl.trans(wg.to(dtype)), acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(a, tl.trans(wu.to(dtype)), acc_u, input_precision=DOT_PRECISION)
    h = _silu_mul(acc_g, acc_u, inter_ptr.dtype.element_ty)
    out_ptrs = inter_ptr + pairs.to(tl.int64)[:, None] * stride_it + offs_n[None, :]
    tl.store(out_ptrs, h, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def quant_moe_down_grouped_kernel(
    inter_ptr, sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, w_ptr, s_ptr, z_ptr, y_ptr,
    num_pairs, hidden_dim, inter_dim,
    stride_it, stride_we, stride_wn, stride_se, stride_sn, stride_ze, stride_zn, stride_yt,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_T: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """grid (max_blocks * cdiv(H, BLOCK_N),): y[pair] = inter[pair] @ W2[e]^T in the dtype."""
    live, e, pairs, mask_m, offs_n, mask_n = moe_block(
        sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, num_pairs, hidden_dim, BLOCK_M, BLOCK_N
    )
    if not live:
        return
    rows = pairs.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    w_e, s_e, z_e = w_ptr + e * stride_we, s_ptr + e * stride_se, z_ptr + e * stride_ze
    dtype = inter_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter_dim, BLOCK_K):
        ks = k0 + offs_k
        mask_k = ks < inter_dim
        a_ptrs = inter_ptr + rows[:, None] * stride_it + ks[None, :]
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = load_weight_tile(
            w_e, s_e, z_e, offs_n, k0, mask_n, inter_dim, stride_wn, stride_sn, stride_zn,
            FMT, SCALE_BN, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
        )  # fmt: skip
        acc = tl.dot(a, tl.trans(w.to(dtype)), acc, input_precision=DOT_PRECISION)
    y_ptrs = y_ptr + rows[:, None] * stride_yt + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
