"""Triton kernel of a MoE layer's router GEMV with its top-k in the same launch (launched
from `xinfer.kernels.router_launch.router_topk`; twin: `reference.route_topk` of
`reference.linear`).

At decode the router is a small GEMV (E x K: 128 x 2,048 for Qwen3-30B-A3B) and top-k a
launch of one program a token; apart they cost two launches a layer, each a few µs of ramp
and tail for under a µs of work. Here the GEMV's programs store their logits (or, split-K,
their float32 partials) and count in at one arrival counter; the last of them adds the
partials in split order, stores the logits and runs `topk_row` for every row. Bits: the
logits are `gemv_kernel`'s (the same `gemv_tile` loop, the same split order and cast) and the
choice is `route_topk_kernel`'s (the same `topk_row` on the same logits, launched with the
same warps)."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.gemv import gemv_tile
from xinfer.kernels.triton.pdl import wait_for_producers
from xinfer.kernels.triton.routing import topk_row


@triton.jit(do_not_specialize=["M"])
def router_topk_kernel(
    x_ptr, w_ptr, part_ptr, logits_ptr, weights_ptr, ids_ptr, count_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_ps, stride_pm, stride_lm,
    SPLIT: tl.constexpr, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_TK: tl.constexpr, DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """grid (cdiv(N, BLOCK_N), splits): logits (M, N) = x (M, K) @ w (N, K)^T in logits'
    dtype, then weights (M, TOP_K) float32 and ids (M, TOP_K) int32 of each row's choice.
    SPLIT: K is cut in splits whose float32 partials go to part (splits, M, N); otherwise
    each program stores its logits tile directly. count_ptr[0] is zero on entry and on exit."""
    wait_for_producers(USE_PDL)
    acc, offs_m, offs_n, mask_m, mask_n = gemv_tile(
        x_ptr, w_ptr, M, N, K, k_per_split, stride_xm, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K,
        DOT_PRECISION,
    )  # fmt: skip
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT:
        split_part = part_ptr + tl.program_id(1) * stride_ps
        dst = split_part + offs_m[:, None] * stride_pm + offs_n[None, :]
        tl.store(dst, acc, mask=mask)
    else:
        dst = logits_ptr + offs_m[:, None] * stride_lm + offs_n[None, :]
        tl.store(dst, acc.to(logits_ptr.dtype.element_ty), mask=mask)
    # every thread's stores before the release of the count; the last program acquires it
    tl.debug_barrier()
    programs = tl.num_programs(0) * tl.num_programs(1)
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == programs - 1:
        offs_e = tl.arange(0, BLOCK_E)
        mask_e = offs_e < N
        offs_k = tl.arange(0, BLOCK_TK)
        mask_k = offs_k < TOP_K
        for m in range(M):
            if SPLIT:  # gemv's reduce: the partials from zero in split order, then the cast
                row = tl.zeros((BLOCK_E,), dtype=tl.float32)
                for s in range(tl.num_programs(1)):
                    src = part_ptr + s * stride_ps + m * stride_pm + offs_e
                    row += tl.load(src, mask=mask_e, other=0.0, cache_modifier=".cg")
                logit = row.to(logits_ptr.dtype.element_ty)
                tl.store(logits_ptr + m * stride_lm + offs_e, logit, mask=mask_e)
            else:
                src = logits_ptr + m * stride_lm + offs_e
                logit = tl.load(src, mask=mask_e, other=0.0, cache_modifier=".cg")
            x = tl.where(mask_e, logit.to(tl.float32), -float("inf"))
            top_w, top_i = topk_row(x, mask_e, TOP_K, RENORMALIZE, BLOCK_E, BLOCK_TK)
            tl.store(weights_ptr + m * TOP_K + offs_k, top_w, mask=mask_k)
            tl.store(ids_ptr + m * TOP_K + offs_k, top_i, mask=mask_k)
        tl.store(count_ptr, 0)
