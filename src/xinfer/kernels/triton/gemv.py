"""Triton skinny GEMM ("GEMV") for decode-sized linears: out (M, N) = x (M, K) @ w (N, K)^T
(+ bias) for M <= 16 (launched from `xinfer.kernels.gemv_launch`).

A program computes one (BLOCK_M = 16, BLOCK_N) output tile: x rows past M load as zeros, so
the tile has one shape for every M; w streams through once, BLOCK_K columns at a time, and
`tl.dot` accumulates in float32 (x is the 16-row A operand, so the tensor cores run
mma.sync m16n8k16, whose float32 accumulator is carried through K in k order).

Determinism: an output element depends only on its x row, its w row and the K range of its
split, so row i's bits do not depend on M. With split-K, each split stores float32 partials
and they are added in split order: by the tile's last split to arrive (`reduce_when_last`,
REDUCE; the only atomic is its arrival count) or by `gemv_split_reduce_kernel`, a launch of
its own — the same bits either way."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.pdl import wait_for_producers


@triton.jit
def reduce_when_last(
    part_ptr, bias_ptr, final_ptr, count_ptr, tile, splits, offs_m, offs_n, mask_m, mask_n,
    stride_ps, stride_pm, stride_fm,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The tail of a split-K program that has stored its float32 partial tile
    part[split, offs_m, offs_n]: the split that completes output tile `tile` (the last of
    `splits` to arrive at count_ptr[tile]) adds the tile's partials in split order from
    zero, then the bias, stores final[offs_m, offs_n] in its dtype — what
    `gemv_split_reduce_kernel` computes — and sets the counter back to 0. The CTA barrier
    puts every thread's partial stores before the counter's release; the last split
    acquires it and reads the others' partials from L2 (`.cg`)."""
    counter = count_ptr + tile
    tl.debug_barrier()
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if arrived == splits - 1:
        mask = mask_m[:, None] & mask_n[None, :]
        ptrs = part_ptr + offs_m[:, None] * stride_pm + offs_n[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(splits):
            acc += tl.load(ptrs + s * stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        final = final_ptr + offs_m[:, None] * stride_fm + offs_n[None, :]
        tl.store(final, acc.to(final_ptr.dtype.element_ty), mask=mask)
        tl.store(counter, 0)


@triton.jit
def four_rows(y0, y1, y2, y3):
    """(4, BLOCK_N): the per-row results (BLOCK_N,) of the four-row GEMV programs stacked
    as the output tile `store_split_tile` takes."""
    r = tl.arange(0, 4)[:, None]
    return tl.where(r == 0, y0[None, :], tl.where(
        r == 1, y1[None, :], tl.where(r == 2, y2[None, :], y3[None, :])))  # fmt: skip


@triton.jit
def store_split_tile(
    acc, out_ptr, bias_ptr, final_ptr, count_ptr, tile, split, splits, offs_m, offs_n,
    mask_m, mask_n, stride_os, stride_om, stride_fm,
    HAS_BIAS: tl.constexpr, REDUCE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The epilogue of a split-K linear's program (this kernel's and the quantized and GGUF
    ones'): its (BLOCK_M, BLOCK_N) float32 tile `acc` of split `split`, plus the bias where
    the tile is the whole sum, stored in out's dtype at out[split]; with REDUCE the tile's
    last split then finishes it into `final` (`reduce_when_last`)."""
    if HAS_BIAS and not REDUCE:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    out_ptrs = (
        out_ptr + split.to(tl.int64) * stride_os + offs_m.to(tl.int64)[:, None] * stride_om
        + offs_n[None, :]
    )  # fmt: skip
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
    if REDUCE:
        reduce_when_last(
            out_ptr, bias_ptr, final_ptr, count_ptr, tile, splits, offs_m, offs_n, mask_m,
            mask_n, stride_os, stride_om, stride_fm, HAS_BIAS, BLOCK_M, BLOCK_N,
        )  # fmt: skip


@triton.jit(do_not_specialize=["M", "N", "stride_os", "stride_om", "stride_fm"])
def gemv_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, final_ptr, count_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_os, stride_om, stride_fm,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, REDUCE: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """grid (cdiv(N, BLOCK_N), splits): out[split, m, n] = sum of x[m, k] * w[n, k] over the
    split's K range [split * k_per_split, +k_per_split), plus bias[n], in out's dtype.
    Split-K launches pass a float32 `out` of shape (splits, M, N); with REDUCE the tile's
    last split adds them into `final` (M, N), bias included (`reduce_when_last`), otherwise
    they pass no bias and `gemv_split_reduce_kernel` follows.
    M, N and the output strides are not specialised: one compile serves every M and N."""
    wait_for_producers(USE_PDL)
    acc, offs_m, offs_n, mask_m, mask_n = gemv_tile(
        x_ptr, w_ptr, M, N, K, k_per_split, stride_xm, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K,
        DOT_PRECISION,
    )  # fmt: skip
    store_split_tile(
        acc, out_ptr, bias_ptr, final_ptr, count_ptr, tl.program_id(0), tl.program_id(1),
        tl.num_programs(1), offs_m, offs_n, mask_m, mask_n, stride_os, stride_om, stride_fm,
        HAS_BIAS, REDUCE, BLOCK_M, BLOCK_N,
    )  # fmt: skip


@triton.jit
def gemv_tile(
    x_ptr, w_ptr, M, N, K, k_per_split, stride_xm, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """This program's tile of a grid (N tiles, K splits): the float32 (BLOCK_M, BLOCK_N) sum
    of x[m, k] * w[n, k] over its split's K range, and its (offs_m, offs_n, mask_m, mask_n).
    `gemv_kernel`'s loop and the router's (`router_topk_kernel`), so the two give one logit
    the same bits."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_begin = tl.program_id(1) * k_per_split
    offs_k = tl.arange(0, BLOCK_K)
    k_end = tl.minimum(K, k_begin + k_per_split)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_begin + offs_k)[None, :]  # (M, K) tile
    w_rows = offs_n.to(tl.int64)[None, :] * stride_wn
    w_ptrs = w_ptr + w_rows + (k_begin + offs_k)[:, None]  # (K, N) tile: w^T
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        mask_k = offs_k < k_end - k0
        x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc, offs_m, offs_n, mask_m, mask_n


@triton.jit(do_not_specialize=["N", "stride_ps", "stride_pm", "stride_om"])
def gemv_split_reduce_kernel(
    part_ptr, bias_ptr, out_ptr,
    N, stride_ps, stride_pm, stride_om,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """grid (M, cdiv(N, BLOCK_N)): out[m, n] = sum over splits, in split order and float32,
    of part[split, m, n], plus bias[n], cast to out's dtype."""
    m = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    part_ptrs = part_ptr + m * stride_pm + offs_n
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptrs + s * stride_ps, mask=mask_n, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)
