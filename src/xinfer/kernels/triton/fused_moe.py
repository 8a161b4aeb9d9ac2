"""Triton kernels of the routed-expert MLP (launched from `xinfer.kernels.moe_launch`).

Decode: GEMV kernels over (token, k) pairs. Prefill: grouped GEMM over rows sorted by id and
padded to BLOCK_M. Every rounding mirrors `reference.fused_moe`: gate/up outputs, the SiLU
output, the product and each expert output are rounded to the activation dtype."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.moe_blocks import moe_block
from xinfer.kernels.triton.pdl import wait_for_producers


@triton.jit
def _silu_mul(g, u, DTYPE: tl.constexpr):
    # reference: (x @ w13.T) in DTYPE, then F.silu(gate) * up, each op rounded to DTYPE
    g = g.to(DTYPE).to(tl.float32)
    u = u.to(DTYPE).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(DTYPE).to(tl.float32)
    return (s * u).to(DTYPE)


@triton.jit
def moe_gate_up_gemv_kernel(
    x_ptr, ids_ptr, w13_ptr, inter_ptr,
    hidden_dim, inter_dim,
    stride_xt, stride_we, stride_wn, stride_it,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """grid (T*k, cdiv(I, BLOCK_N)): inter[pair, n] = silu(x·w13[e, n]) * (x·w13[e, I + n])."""
    wait_for_producers(USE_PDL)
    pair = tl.program_id(0)
    pid_n = tl.program_id(1)
    tok = (pair // TOP_K).to(tl.int64)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < inter_dim
    x_row = x_ptr + tok * stride_xt + offs_k
    w_gate = w13_ptr + e * stride_we + offs_n[:, None] * stride_wn + offs_k[None, :]
    w_up = w_gate + inter_dim * stride_wn
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, hidden_dim, BLOCK_K):
        mask_k = offs_k < hidden_dim - k0
        mask_w = mask_n[:, None] & mask_k[None, :]
        x = tl.load(x_row + k0, mask=mask_k, other=0.0).to(tl.float32)
        wg = tl.load(w_gate + k0, mask=mask_w, other=0.0).to(tl.float32)
        wu = tl.load(w_up + k0, mask=mask_w, other=0.0).to(tl.float32)
        acc_g += wg * x[None, :]
        acc_u += wu * x[None, :]
    h = _silu_mul(tl.sum(acc_g, axis=1), tl.sum(acc_u, axis=1), inter_ptr.dtype.element_ty)
    tl.store(inter_ptr + pair.to(tl.int64) * stride_it + offs_n, h, mask=mask_n)


@triton.jit
def combine_when_last(
    y_ptr, weights_ptr, out_ptr, count_ptr, pair, pid_n, num_tiles, offs_n, mask_n,
    stride_yt, stride_ot, TOP_K: tl.constexpr,
):  # fmt: skip
    """The tail of a down GEMV program (grid (T*k, num_tiles)) that has stored its y tile:
    the program that completes a token's row tile — the TOP_K-th of that token's pairs to
    arrive at `count_ptr[tok * num_tiles + pid_n]` — sums the tile as `moe_combine_kernel`
    does (k order, float32, one rounding) and sets the counter back to 0 for the next
    launch. One launch fewer a MoE layer than a separate combine, the same bits: each y is
    the stored, rounded value, and the sum is the combine kernel's expression in its order.
    Ordering: the CTA barrier puts every thread's y stores before the counter's release;
    the last program acquires it and reads the others' tiles from L2 (`.cg`)."""
    tok = pair // TOP_K
    counter = count_ptr + tok * num_tiles + pid_n
    tl.debug_barrier()
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if arrived == TOP_K - 1:
        out = tl.zeros(offs_n.shape, dtype=tl.float32)
        for j in range(TOP_K):
            p = tok * TOP_K + j
            route_w = tl.load(weights_ptr + p)
            y = tl.load(y_ptr + p * stride_yt + offs_n, mask=mask_n, other=0.0,
                        cache_modifier=".cg")  # fmt: skip
            out += y.to(tl.float32) * route_w
        tl.store(out_ptr + tok * stride_ot + offs_n, out.to(out_ptr.dtype.element_ty),
                 mask=mask_n)  # fmt: skip
        tl.store(counter, 0)


@triton.jit
def moe_down_gemv_kernel(
    inter_ptr, ids_ptr, w2_ptr, y_ptr,
    weights_ptr, out_ptr, count_ptr,
    hidden_dim, inter_dim,
    stride_it, stride_we, stride_wn, stride_yt, stride_ot,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TOP_K: tl.constexpr, COMBINE: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """grid (T*k, cdiv(H, BLOCK_N)): y[pair, n] = inter[pair]·w2[e, n], rounded to the dtype.
    One program per (pair, row tile) so that all experts of a token stream in parallel; with
    COMBINE the last of a token's programs sums its pairs (`combine_when_last`), otherwise
    `moe_combine_kernel` does, in a launch of its own."""
    wait_for_producers(USE_PDL)
    pair = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < hidden_dim
    a_row = inter_ptr + pair * stride_it + offs_k
    w_rows = w2_ptr + e * stride_we + offs_n[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, inter_dim, BLOCK_K):
        mask_k = offs_k < inter_dim - k0
        a = tl.load(a_row + k0, mask=mask_k, other=0.0).to(tl.float32)
        w = tl.load(w_rows + k0, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        acc += w.to(tl.float32) * a[None, :]
    y = tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + pair * stride_yt + offs_n, y, mask=mask_n)
    if COMBINE:
        combine_when_last(
            y_ptr, weights_ptr, out_ptr, count_ptr, pair, pid_n, tl.num_programs(1), offs_n,
            mask_n, stride_yt, stride_ot, TOP_K,
        )  # fmt: skip


@triton.jit
def moe_gate_up_grouped_kernel(
    x_ptr, sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, w13_ptr, inter_ptr,
    num_pairs, hidden_dim, inter_dim,
    stride_xt, stride_we, stride_wn, stride_it,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """grid (max_blocks * cdiv(I, BLOCK_N),): one BLOCK_M tile of rows that share one id;
    padding rows hold `num_pairs` and are masked. Writes inter[pair] (pair order)."""
    live, e, pairs, mask_m, offs_n, mask_n = moe_block(
        sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, num_pairs, inter_dim, BLOCK_M, BLOCK_N
    )
    if not live:
        return  # beyond the padded rows actually used this call
    toks = (pairs // TOP_K).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + toks[:, None] * stride_xt + offs_k[None, :]  # (BLOCK_M, BLOCK_K)
    g_ptrs = w13_ptr + e * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]  # (K, N)
    u_ptrs = g_ptrs + inter_dim * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden_dim, BLOCK_K):
        mask_k = offs_k < hidden_dim - k0
        a = tl.load(a_ptrs + k0, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        mask_b = mask_k[:, None] & mask_n[None, :]
        bg = tl.load(g_ptrs + k0, mask=mask_b, other=0.0)
        bu = tl.load(u_ptrs + k0, mask=mask_b, other=0.0)
        acc_g = tl.dot(a, bg, acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(a, bu, acc_u, input_precision=DOT_PRECISION)
    h = _silu_mul(acc_g, acc_u, inter_ptr.dtype.element_ty)
    out_ptrs = inter_ptr + pairs.to(tl.int64)[:, None] * stride_it + offs_n[None, :]
    tl.store(out_ptrs, h, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def moe_down_grouped_kernel(
    inter_ptr, sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, w2_ptr, y_ptr,
    num_pairs, hidden_dim, inter_dim,
    stride_it, stride_we, stride_wn, stride_yt,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """grid (max_blocks * cdiv(H, BLOCK_N),): y[pair] = inter[pair] @ w2[e].T in the dtype."""
    live, e, pairs, mask_m, offs_n, mask_n = moe_block(
        sorted_pairs_ptr, block_ids_ptr, num_rows_ptr, num_pairs, hidden_dim, BLOCK_M, BLOCK_N
    )
    if not live:
        return
    rows = pairs.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = inter_ptr + rows[:, None] * stride_it + offs_k[None, :]
    b_ptrs = w2_ptr + e * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter_dim, BLOCK_K):
        mask_k = offs_k < inter_dim - k0
        a = tl.load(a_ptrs + k0, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs + k0, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    y_ptrs = y_ptr + rows[:, None] * stride_yt + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def moe_combine_kernel(
    y_ptr, weights_ptr, out_ptr,
    hidden_dim, stride_yt, stride_ot,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """grid (T, cdiv(H, BLOCK_N)): out[t] = sum_k w[t, k] * y[t*k + k], k order, float32."""
    tok = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hidden_dim
    out = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(TOP_K):
        pair = tok * TOP_K + j
        route_w = tl.load(weights_ptr + pair)
        y = tl.load(y_ptr + pair * stride_yt + offs_n, mask=mask_n, other=0.0)
        out += y.to(tl.float32) * route_w
    tl.store(out_ptr + tok * stride_ot + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _number_ids(
    ids_ptr, flags_ptr, experts_ptr, numbers_ptr,
    num_pairs, num_set_ids, num_numbers,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Number the ids the pairs use 0, 1, ... in increasing id order: experts[number] = its id,
    numbers[pair] = its id's number. flags (num_set_ids,) is scratch (zeroed here). Ids that
    are negative or >= num_set_ids, and numbers from num_numbers on (a call using more ids
    than its promised bound), give their pairs -1: left out, never an address outside the
    buffers. O(pairs + ids) work; ends with a barrier so every thread may read numbers."""
    offs = tl.arange(0, BLOCK)
    for i0 in range(0, num_set_ids, BLOCK):
        zero = tl.zeros((BLOCK,), dtype=tl.int32)
        tl.store(flags_ptr + i0 + offs, zero, mask=i0 + offs < num_set_ids)
    tl.debug_barrier()  # the zeros must land before the 1s
    one = tl.full((BLOCK,), 1, dtype=tl.int32)
    for c0 in range(0, num_pairs, BLOCK):
        ids = tl.load(ids_ptr + c0 + offs, mask=c0 + offs < num_pairs, other=-1)
        tl.store(flags_ptr + ids, one, mask=(ids >= 0) & (ids < num_set_ids))  # same value: no race
    tl.debug_barrier()
    carry = tl.full((), 0, dtype=tl.int32)  # used ids below i0
    for i0 in range(0, num_set_ids, BLOCK):
        in_set = i0 + offs < num_set_ids
        used = tl.load(flags_ptr + i0 + offs, mask=in_set, other=0)
        number = carry + tl.cumsum(used, axis=0) - 1
        keep = (used > 0) & (number < num_numbers)
        tl.store(experts_ptr + number, i0 + offs, mask=keep)
        # in place: an id's number needs its own flag, so no thread can store over a flag
        # another thread has yet to load
        tl.store(flags_ptr + i0 + offs, tl.where(keep, number, -1), mask=in_set)
        carry += tl.sum(used, axis=0)
    tl.debug_barrier()
    for c0 in range(0, num_pairs, BLOCK):
        ids = tl.load(ids_ptr + c0 + offs, mask=c0 + offs < num_pairs, other=-1)
        number = tl.load(flags_ptr + ids, mask=(ids >= 0) & (ids < num_set_ids), other=-1)
        tl.store(numbers_ptr + c0 + offs, number, mask=c0 + offs < num_pairs)
    tl.debug_barrier()  # the numbers are read back by other threads


@triton.jit
def moe_align_kernel(
    ids_ptr, sorted_pairs_ptr, block_ids_ptr, num_rows_ptr,
    flags_ptr, experts_ptr, numbers_ptr,
    num_pairs, num_ids, max_rows, num_set_ids,
    BLOCK_M: tl.constexpr, BLOCK_IDS: tl.constexpr, CHUNK: tl.constexpr,
    NUMBERED: tl.constexpr, NUMBER_BLOCK: tl.constexpr,
):  # fmt: skip
    """grid (1,): stable sort of the pairs by id, each id's run padded to BLOCK_M.
    sorted_pairs (max_rows,) gets pair indices (num_pairs = padding), block_ids the id of
    each BLOCK_M tile (num_set_ids - 1 past num_rows), num_rows the padded total. Pairs with
    a negative id are left out. One program: no atomics, no host sync.

    NUMBERED (a set of num_set_ids rows of which a call uses at most num_ids, e.g. an offload
    slot view): the used ids are first numbered 0, 1, ... in id order (`_number_ids`, into
    the scratch flags (num_set_ids,), experts (num_ids,), numbers (num_pairs,)), the pairs
    sorted by number (the same order: numbers grow with ids) and each tile's number mapped
    back to its id, so the one-hot work is pairs × BLOCK_IDS with BLOCK_IDS =
    next_pow2(num_ids), not next_pow2(num_set_ids). Unnumbered: num_set_ids == num_ids and
    the flags/experts/numbers pointers are unused."""
    if NUMBERED:
        _number_ids(
            ids_ptr, flags_ptr, experts_ptr, numbers_ptr, num_pairs, num_set_ids, num_ids,
            NUMBER_BLOCK,
        )  # fmt: skip
        src_ptr = numbers_ptr
    else:
        src_ptr = ids_ptr
    offs_e = tl.arange(0, BLOCK_IDS)
    offs_c = tl.arange(0, CHUNK)
    counts = tl.zeros((BLOCK_IDS,), dtype=tl.int32)
    for c0 in range(0, num_pairs, CHUNK):
        ids = tl.load(src_ptr + c0 + offs_c, mask=c0 + offs_c < num_pairs, other=-1)
        counts += tl.sum((ids[None, :] == offs_e[:, None]).to(tl.int32), axis=1)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, axis=0)  # (BLOCK_IDS,)
    padded_start = padded_end - padded
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    pad = tl.zeros((CHUNK,), dtype=tl.int32) + num_pairs
    for r0 in range(0, max_rows, CHUNK):
        tl.store(sorted_pairs_ptr + r0 + offs_c, pad, mask=r0 + offs_c < max_rows)
    for b0 in range(0, max_rows // BLOCK_M, CHUNK):
        starts = (b0 + offs_c) * BLOCK_M
        blk = tl.sum((padded_end[None, :] <= starts[:, None]).to(tl.int32), axis=1)
        if NUMBERED:
            # below num_rows blk is a used number; past it blk = BLOCK_IDS >= num_ids, and
            # the tile gets what the unnumbered kernel gives it (the GEMMs exit there)
            blk = tl.load(experts_ptr + blk, mask=blk < num_ids, other=num_set_ids - 1)
        else:
            blk = tl.minimum(blk, num_ids - 1)  # tiles past num_rows exit early in the GEMMs
        tl.store(block_ids_ptr + b0 + offs_c, blk, mask=b0 + offs_c < max_rows // BLOCK_M)
    tl.debug_barrier()  # the padding fill above must land before the pairs below
    seen = tl.zeros((BLOCK_IDS,), dtype=tl.int32)  # pairs of each id placed so far
    for c0 in range(0, num_pairs, CHUNK):
        ids = tl.load(src_ptr + c0 + offs_c, mask=c0 + offs_c < num_pairs, other=-1)
        mask = ids >= 0  # in range and not left out (the counts above never match -1)
        onehot = ids[:, None] == offs_e[None, :]  # (CHUNK, BLOCK_IDS)
        base = tl.sum(tl.where(onehot, (padded_start + seen)[None, :], 0), axis=1)
        # stable: rank among the earlier pairs of this chunk with the same id
        before = (ids[:, None] == ids[None, :]) & (offs_c[None, :] < offs_c[:, None])
        rank = tl.sum(before.to(tl.int32), axis=1)
        tl.store(sorted_pairs_ptr + base + rank, c0 + offs_c, mask=mask)
        seen += tl.sum(onehot.to(tl.int32), axis=0)
