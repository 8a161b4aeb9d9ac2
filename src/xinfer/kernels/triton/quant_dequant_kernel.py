"""Triton kernel that dequantizes a quantized weight (N, K), or experts of an `[E, N, K]` set,
into a dense copy in the activation dtype (launched from `xinfer.kernels.quant_prefill`).
Each element is computed by the tile loaders of `quant_dequant.py` in float32, as the
format's twin computes it, then rounded once to the output dtype: the twin's bits."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.quant_dequant import load_weight_tile


@triton.jit
def _tile(
    w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim, stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr,
):  # fmt: skip
    """The one call of the shared tile loader: (BLOCK_N, BLOCK_K) float32 of the columns
    k0 .. k0 + BLOCK_K, masked = 0."""
    return load_weight_tile(
        w_ptr, s_ptr, z_ptr, offs_n, k0, mask_n, k_dim, stride_wn, stride_sn, stride_zn,
        FMT, SCALE_BN, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
    )  # fmt: skip


@triton.jit
def expert_of(ids_ptr, first, j, GATHER: tl.constexpr):
    """The expert a dequant program's output slot j holds: first + j, or with GATHER
    ids[first + j] (-1 or any negative id: none, the program exits). int64."""
    if GATHER:
        e = tl.load(ids_ptr + first + j).to(tl.int64)
    else:
        e = first + j
    return e


@triton.jit(do_not_specialize=["first"])
def dequant_kernel(
    w_ptr, s_ptr, z_ptr, p_ptr, ids_ptr, out_ptr,
    first, N, K,
    stride_we, stride_wn, stride_se, stride_sn, stride_ze, stride_zn, stride_pe, stride_oe,
    stride_on,
    FMT: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, HAS_ZERO: tl.constexpr,
    GATHER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_T: tl.constexpr, HAS_PERM: tl.constexpr = False,
):  # fmt: skip
    """grid (cdiv(N, BLOCK_N), cdiv(K, BLOCK_K), count): out[j] = dequant(W[first + j]) for
    the `count` experts from `first`; GATHER: out[j] = dequant(W[ids[first + j]]) (`ids`
    int32), a negative id skipped, its rows of `out` left as they are. HAS_PERM (act-order
    int4): stored column c is written to column perm[c] (the input-channel order)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    j = tl.program_id(2).to(tl.int64)
    e = expert_of(ids_ptr, first, j, GATHER)
    if e < 0:
        return
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_k = offs_k < K
    w = _tile(
        w_ptr + e * stride_we, s_ptr + e * stride_se, z_ptr + e * stride_ze,
        offs_n, pid_k * BLOCK_K, mask_n, K, stride_wn, stride_sn, stride_zn,
        FMT, SCALE_BN, SCALE_BK, HAS_ZERO, BLOCK_K, GROUP_T,
    )  # fmt: skip
    if HAS_PERM:  # a scattered store: stored column c is input channel perm[c]
        cols = tl.load(p_ptr + e * stride_pe + offs_k, mask=mask_k, other=0).to(tl.int32)
    else:
        cols = offs_k
    out_ptrs = out_ptr + j * stride_oe + offs_n.to(tl.int64)[:, None] * stride_on + cols[None, :]
    tl.store(out_ptrs, w.to(out_ptr.dtype.element_ty), mask=mask_n[:, None] & mask_k[None, :])
