"""Paged attention over the KV cache (GQA, float32 online softmax in base 2).

Decode (one query per sequence), flash-decoding: one program per (sequence, KV head, split)
holds all the query heads of that KV head, so K/V are read once, and attends to a fixed range
of `split_len` keys; each query head's non-empty splits are then merged in order, by the last
split of its (sequence, KV head) to arrive (`REDUCE`, counters from kernels/arrivals.py) or by
a second kernel, `decode_reduce_kernel` — the same code (`_merge_head`), the same bits.
Prefill: flash-attention tiles over packed variable-length queries, rows = (token, query head
of the group). With a sliding window W (`HAS_WINDOW`, Gemma 3's local layers) a query at
position p sees keys (p - W, p] only: decode skips the splits before the window, prefill
starts its key loop at the tile's first visible key and masks both edges. With `TURBO_BITS`
the caches hold TurboQuant codes and scales (kv/turbo.py), read by `turbo_kv_rows`."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.kv_turbo import turbo_kv_rows
from xinfer.kernels.triton.pdl import wait_for_producers


@triton.jit
def _block_ids(table_ptr, n, num_blocks, block_size: tl.constexpr):
    """Cache block of each key position `n` (int64), 0 past the table's `num_blocks` columns.
    Entries past the sequence's end may be stale: callers mask the K/V loads, not this one."""
    idx = n // block_size
    return tl.load(table_ptr + idx, mask=idx < num_blocks, other=0).to(tl.int64)


@triton.jit
def _load_kv_rows(
    cache_ptr, scale_ptr, centroids_ptr, blk, n, n_mask, d, d_mask, block_size: tl.constexpr,
    stride_b, stride_s, HEAD_DIM: tl.constexpr, TURBO_BITS: tl.constexpr,
    TURBO_SHUFFLE: tl.constexpr,
):  # fmt: skip
    """(BLOCK_N, BLOCK_D) rows of key positions `n` held in cache blocks `blk`. TURBO_BITS
    > 0: a TurboQuant cache (`cache_ptr` its codes, `scale_ptr` its scales, both at the KV
    head), read as float32 rotated rows by `turbo_kv_rows`."""
    if TURBO_BITS > 0:
        rows = turbo_kv_rows(
            cache_ptr, scale_ptr, centroids_ptr, blk, n, n_mask, d, d_mask, block_size,
            stride_b, stride_s, HEAD_DIM, TURBO_BITS, TURBO_SHUFFLE,
        )  # fmt: skip
    else:
        offs = blk[:, None] * stride_b + (n % block_size)[:, None] * stride_s + d[None, :]
        rows = tl.load(cache_ptr + offs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)
    return rows


@triton.jit
def _load_kv_tiles(
    k_base, v_base, k_scales, v_scales, centroids_ptr, table_ptr, n, n_mask, d, d_mask,
    block_size: tl.constexpr, stride_kb, stride_ks, stride_vb, stride_vs,
    HEAD_DIM: tl.constexpr, TURBO_BITS: tl.constexpr, TURBO_SHUFFLE: tl.constexpr,
):  # fmt: skip
    """The (BLOCK_N, BLOCK_D) K and V rows `n` of one sequence and KV head, through its block
    table (read once for both)."""
    blk = tl.load(table_ptr + n // block_size, mask=n_mask, other=0).to(tl.int64)
    k = _load_kv_rows(
        k_base, k_scales, centroids_ptr, blk, n, n_mask, d, d_mask, block_size, stride_kb,
        stride_ks, HEAD_DIM, TURBO_BITS, TURBO_SHUFFLE,
    )  # fmt: skip
    v = _load_kv_rows(
        v_base, v_scales, centroids_ptr, blk, n, n_mask, d, d_mask, block_size, stride_vb,
        stride_vs, HEAD_DIM, TURBO_BITS, TURBO_SHUFFLE,
    )  # fmt: skip
    return k, v


@triton.jit
def _softmax_step(q, k, v, s_mask, m_i, l_i, acc, scale_log2, DOT_PRECISION: tl.constexpr):
    """One online-softmax update with a K/V tile; scores are in log2 units."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # (M, N)
    s = tl.where(s_mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # -inf only for a row that has seen no key yet (a window starts after this tile): its
    # p and alpha must be 0, not NaN; finite m_new keeps every other row's bits unchanged
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _merge_head(
    part_out_ptr, part_lse_ptr, out_ptr, seq, head, num_heads, seq_len, num_splits, split_len,
    window, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_WINDOW: tl.constexpr, CACHE: tl.constexpr,
):  # fmt: skip
    """Merge the non-empty splits of query head `head` of sequence `seq` (of `num_heads`),
    BLOCK_S at a time in split order, so the bits depend on neither the batch nor
    num_splits, and store out[seq, head]; seq_len 0 gives zeros. `CACHE`: the parts' load
    cache modifier (".cg" where another program of this launch stored them)."""
    used = tl.minimum(tl.cdiv(seq_len, split_len), num_splits)  # keys past the bound: unread
    first = 0
    if HAS_WINDOW:  # the first split that holds a key of the window
        first = tl.maximum(seq_len - window, 0) // split_len
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    base = (seq.to(tl.int64) * num_heads + head) * num_splits
    m_run = tl.full([], float("-inf"), tl.float32)
    l_run = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(first, used, BLOCK_S):
        s_mask = s0 + s < used
        rows = base + s0 + s
        lse = tl.load(part_lse_ptr + rows, mask=s_mask, other=float("-inf"), cache_modifier=CACHE)
        o_ptrs = part_out_ptr + rows[:, None] * HEAD_DIM + d[None, :]
        o_mask = s_mask[:, None] & d_mask[None, :]
        o = tl.load(o_ptrs, mask=o_mask, other=0.0, cache_modifier=CACHE).to(tl.float32)
        m_new = tl.maximum(m_run, tl.max(lse, axis=0))  # finite: split `first` is non-empty
        alpha = tl.exp2(m_run - m_new)
        w = tl.exp2(lse - m_new)
        l_run = l_run * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(o * w[:, None], axis=0)
        m_run = m_new
    out = acc / tl.where(l_run > 0, l_run, 1.0)
    o_ptrs = out_ptr + seq.to(tl.int64) * stride_ot + head * stride_oh + d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=d_mask)


@triton.jit
def _merge_when_last(
    part_out_ptr, part_lse_ptr, out_ptr, count_ptr, seq, kv_head, num_kv_heads, seq_len,
    num_splits, split_len, window, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr, HAS_WINDOW: tl.constexpr,
):  # fmt: skip
    """The tail of every decode program, empty splits included: the split that completes
    (sequence, KV head) — the last of `num_splits` to arrive at its counter — merges the
    splits of each of the KV head's GROUP query heads as `decode_reduce_kernel` does
    (`_merge_head`, reading the stored, rounded parts) and sets the counter back to 0. The
    CTA barrier puts every thread's part stores before the counter's release; the last
    split acquires it and reads the others' parts from L2 (`.cg`)."""
    counter = count_ptr + seq * num_kv_heads + kv_head
    tl.debug_barrier()
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if arrived == num_splits - 1:
        for g in range(GROUP):
            _merge_head(
                part_out_ptr, part_lse_ptr, out_ptr, seq, kv_head * GROUP + g,
                num_kv_heads * GROUP, seq_len, num_splits, split_len, window, stride_ot,
                stride_oh, HEAD_DIM, BLOCK_S, BLOCK_D, HAS_WINDOW, ".cg",
            )  # fmt: skip
        tl.store(counter, 0)


@triton.jit(do_not_specialize=["num_splits", "split_len", "table_blocks", "window"])
def decode_kernel(
    q_ptr,  # (B, Hq, D): one query token per sequence
    k_cache_ptr,  # (num_blocks, block_size, Hk, D); TURBO_BITS: codes (.., Hk, bits * D / 8)
    v_cache_ptr,
    k_scale_ptr,  # TURBO_BITS: (num_blocks, block_size, Hk) float16 scales, else unused
    v_scale_ptr,
    centroids_ptr,  # TURBO_BITS: (2^bits,) float32 codebook, else unused
    block_tables_ptr,  # (B, table_blocks)
    seq_lens_ptr,  # (B,) 0 = padding row
    part_out_ptr,  # (B, Hq, num_splits, D) normalised partial outputs, in q's dtype
    part_lse_ptr,  # (B, Hq, num_splits) float32 log2-sum-exp2 of the split's scores
    out_ptr,  # (B, Hq, D), written with REDUCE only
    count_ptr,  # (>= B * Hk,) int32 arrival counters, zero; read with REDUCE only
    scale_log2,
    num_splits,
    split_len,  # keys per split, a multiple of BLOCK_N
    table_blocks,  # columns of the block table
    window,  # sliding window W (keys (p - W, p]); read only with HAS_WINDOW
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_S: tl.constexpr,  # splits a merge step (REDUCE)
    HAS_WINDOW: tl.constexpr = False,
    REDUCE: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
    TURBO_BITS: tl.constexpr = 0,  # > 0: a TurboQuant cache of this many bits (kv/turbo.py)
    TURBO_SHUFFLE: tl.constexpr = False,  # its centroid lookup by shuffles (`turbo_kv_rows`)
):
    """Partial attention of one (sequence, KV head) over keys [split * split_len, +split_len)
    (fixed ranges, independent of the batch). Splits past the sequence's end, or wholly
    before its window, write nothing: the merge reads only the splits in between. With
    REDUCE every program then arrives at its (sequence, KV head)'s counter and the last one
    merges (`_merge_when_last`); otherwise `decode_reduce_kernel` follows."""
    wait_for_producers(USE_PDL)
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start = split * split_len
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g
    g_mask, d_mask = g < GROUP, d < HEAD_DIM
    # q and the first tile's block ids do not depend on seq_len: their loads overlap its load
    q_ptrs = q_ptr + seq.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    blk = _block_ids(table, start + tl.arange(0, BLOCK_N), table_blocks, KV_BLOCK_SIZE)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    end = tl.minimum(start + split_len, seq_len)
    if HAS_WINDOW:  # the query is at seq_len - 1: keys from seq_len - W on
        start = tl.maximum(start, seq_len - window)
        blk = _block_ids(table, start + tl.arange(0, BLOCK_N), table_blocks, KV_BLOCK_SIZE)
    if start < end:  # an empty split stores nothing (but arrives, with REDUCE)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        k_base = k_cache_ptr + kv_head * stride_kh
        v_base = v_cache_ptr + kv_head * stride_vh
        k_scales, v_scales = k_scale_ptr + kv_head, v_scale_ptr + kv_head  # TURBO_BITS only
        for n0 in range(start, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n_mask = n < end
            k = _load_kv_rows(
                k_base, k_scales, centroids_ptr, blk, n, n_mask, d, d_mask, KV_BLOCK_SIZE,
                stride_kb, stride_ks, HEAD_DIM, TURBO_BITS, TURBO_SHUFFLE,
            )  # fmt: skip
            v = _load_kv_rows(
                v_base, v_scales, centroids_ptr, blk, n, n_mask, d, d_mask, KV_BLOCK_SIZE,
                stride_vb, stride_vs, HEAD_DIM, TURBO_BITS, TURBO_SHUFFLE,
            )  # fmt: skip
            blk = _block_ids(table, n + BLOCK_N, table_blocks, KV_BLOCK_SIZE)  # next tile's
            m_i, l_i, acc = _softmax_step(
                q, k.to(q.dtype), v.to(q.dtype), n_mask[None, :], m_i, l_i, acc, scale_log2,
                DOT_PRECISION,
            )  # fmt: skip

        row = (seq.to(tl.int64) * GROUP * tl.num_programs(1) + heads) * num_splits + split
        out = acc / l_i[:, None]  # l_i >= 1: the split holds at least one key
        out_ptrs = part_out_ptr + row[:, None] * HEAD_DIM + d[None, :]
        out_mask = g_mask[:, None] & d_mask[None, :]
        tl.store(out_ptrs, out.to(part_out_ptr.dtype.element_ty), mask=out_mask)
        tl.store(part_lse_ptr + row, m_i + tl.log2(l_i), mask=g_mask)
    if REDUCE:
        _merge_when_last(
            part_out_ptr, part_lse_ptr, out_ptr, count_ptr, seq, kv_head, tl.num_programs(1),
            seq_len, num_splits, split_len, window, stride_ot, stride_oh, HEAD_DIM, GROUP,
            BLOCK_S, BLOCK_D, HAS_WINDOW,
        )  # fmt: skip


@triton.jit(do_not_specialize=["num_splits", "split_len", "window"])
def decode_reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    seq_lens_ptr,
    out_ptr,  # (B, Hq, D)
    num_splits,
    split_len,
    window,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_WINDOW: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    """grid (B, Hq): merge the non-empty splits of one (sequence, query head)
    (`_merge_head`), in a launch after `decode_kernel`'s."""
    wait_for_producers(USE_PDL)
    seq, head = tl.program_id(0), tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    _merge_head(
        part_out_ptr, part_lse_ptr, out_ptr, seq, head, tl.num_programs(1), seq_len, num_splits,
        split_len, window, stride_ot, stride_oh, HEAD_DIM, BLOCK_S, BLOCK_D, HAS_WINDOW, "",
    )  # fmt: skip


@triton.jit
def prefill_kernel(
    q_ptr,  # (T, Hq, D) packed new tokens of all sequences
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,  # TURBO_BITS only, as in decode_kernel
    v_scale_ptr,
    centroids_ptr,
    block_tables_ptr,
    seq_lens_ptr,  # (B,) cached tokens incl. the new ones (which are the last q_len)
    query_start_loc_ptr,  # (B+1,)
    out_ptr,  # (T, Hq, D)
    scale_log2,
    window,  # sliding window W; read only with HAS_WINDOW
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # query tokens per tile; BLOCK_Q * GROUP <= BLOCK_M
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr = False,
    TURBO_BITS: tl.constexpr = 0,
    TURBO_SHUFFLE: tl.constexpr = False,
):
    seq, kv_head = tl.program_id(1), tl.program_id(2)
    q_tile = tl.num_programs(0) - 1 - tl.program_id(0)  # longest (last) tiles start first
    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int32)
    q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_start
    if q_tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    ctx_len = seq_len - q_len  # tokens cached before this step's

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    tok = q_tile * BLOCK_Q + r // GROUP  # index among this sequence's new tokens
    heads = kv_head * GROUP + r % GROUP
    row_mask = (r // GROUP < BLOCK_Q) & (tok < q_len)
    d_mask = d < HEAD_DIM
    row_off = (q_start + tok).to(tl.int64)
    q_ptrs = q_ptr + row_off[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    pos = ctx_len + tok  # causal: row sees keys <= pos (rows past q_len see all keys)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    k_scales, v_scales = k_scale_ptr + kv_head, v_scale_ptr + kv_head  # TURBO_BITS only
    kv_end = tl.minimum(ctx_len + (q_tile + 1) * BLOCK_Q, seq_len)
    if HAS_WINDOW:  # from the tile's first visible key, every tile masks both edges
        full_start = tl.maximum(ctx_len + q_tile * BLOCK_Q - window + 1, 0) // BLOCK_N * BLOCK_N
        full_end = full_start
    else:  # keys before the tile's first position are visible to every row: no mask needed
        full_start = 0
        full_end = (ctx_len + q_tile * BLOCK_Q + 1) // BLOCK_N * BLOCK_N
    all_n = tl.full([1, BLOCK_N], 1, tl.int1)
    for n0 in range(full_start, full_end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < full_end
        k, v = _load_kv_tiles(
            k_base, v_base, k_scales, v_scales, centroids_ptr, table, n, n_mask, d, d_mask,
            KV_BLOCK_SIZE, stride_kb, stride_ks, stride_vb, stride_vs, HEAD_DIM, TURBO_BITS,
            TURBO_SHUFFLE,
        )  # fmt: skip
        m_i, l_i, acc = _softmax_step(
            q, k.to(q.dtype), v.to(q.dtype), all_n, m_i, l_i, acc, scale_log2, DOT_PRECISION
        )
    for n0 in range(full_end, kv_end, BLOCK_N):  # the diagonal (and the window): masked
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < kv_end
        k, v = _load_kv_tiles(
            k_base, v_base, k_scales, v_scales, centroids_ptr, table, n, n_mask, d, d_mask,
            KV_BLOCK_SIZE, stride_kb, stride_ks, stride_vb, stride_vs, HEAD_DIM, TURBO_BITS,
            TURBO_SHUFFLE,
        )  # fmt: skip
        s_mask = n_mask[None, :] & (n[None, :] <= pos[:, None])
        if HAS_WINDOW:
            s_mask = s_mask & (n[None, :] > pos[:, None] - window)
        m_i, l_i, acc = _softmax_step(
            q, k.to(q.dtype), v.to(q.dtype), s_mask, m_i, l_i, acc, scale_log2, DOT_PRECISION
        )

    out = acc / l_i[:, None]
    o_ptrs = out_ptr + row_off[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])
