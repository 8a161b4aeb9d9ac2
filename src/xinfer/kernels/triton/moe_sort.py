"""Triton kernels of `moe_align.align_pairs`' "count" method: a counting sort of the (token,
k) pairs by id over blocks of pairs, in three or four launches (count → [prefix] → starts →
place) whose work grows with pairs + blocks × ids. Integer counts, no atomics: every output
element has one writer, so the outputs do not depend on scheduling."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def moe_count_kernel(
    ids_ptr, counts_ptr, ranks_ptr, sorted_pairs_ptr,
    num_pairs, num_ids, max_rows, num_blocks,
    BLOCK: tl.constexpr, SUB: tl.constexpr, FILL_ROWS: tl.constexpr, FILL: tl.constexpr,
):  # fmt: skip
    """grid (max(num_blocks, cdiv(max_rows, FILL_ROWS)),): block b < num_blocks holds pairs
    [b * BLOCK, (b + 1) * BLOCK). Writes counts[b, id] (num_blocks, num_ids): how many of
    the block's pairs have id; ranks[pair]: how many earlier pairs of its block have its id
    (stable order); and sorted_pairs rows [p * FILL_ROWS, (p + 1) * FILL_ROWS) = num_pairs,
    the padding a later launch (place) writes over. Ids outside [0, num_ids) are left out.
    Work: BLOCK × BLOCK compares a block, SUB columns at a time (~60 sm_90 warp
    instructions a pair at 128 × 32, 4 warps; a register sort of 1,024 was ~9, but takes
    seconds a block in the interpreter), plus num_ids stores."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    pairs = pid * BLOCK + offs
    ids = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1)
    valid = (ids >= 0) & (ids < num_ids)
    ids = tl.where(valid, ids, -1)  # the counts of left-out pairs below are never used
    rank = tl.zeros((BLOCK,), dtype=tl.int32)
    total = tl.zeros((BLOCK,), dtype=tl.int32)
    offs_s = tl.arange(0, SUB)
    for j0 in range(0, BLOCK, SUB):
        other = pid * BLOCK + j0 + offs_s
        other_ids = tl.load(ids_ptr + other, mask=other < num_pairs, other=-1)
        same = (ids[:, None] == other_ids[None, :]).to(tl.int32)  # (BLOCK, SUB)
        total += tl.sum(same, axis=1)
        rank += tl.sum(tl.where((j0 + offs_s)[None, :] < offs[:, None], same, 0), axis=1)
    tl.store(ranks_ptr + pairs, rank, mask=pairs < num_pairs)
    row = counts_ptr + pid.to(tl.int64) * num_ids
    offs_f = tl.arange(0, FILL)
    row_len = tl.where(pid < num_blocks, num_ids, 0)  # programs past the blocks only fill
    for i0 in range(0, num_ids, FILL):
        tl.store(row + i0 + offs_f, tl.zeros((FILL,), dtype=tl.int32), mask=i0 + offs_f < row_len)
    tl.debug_barrier()  # the zeros must land before the counts (other threads store them)
    tl.store(row + ids, total, mask=valid & (rank == 0))  # one writer an id: its first pair
    pad = tl.zeros((FILL,), dtype=tl.int32) + num_pairs
    for r0 in range(0, FILL_ROWS, FILL):
        rows = pid * FILL_ROWS + r0 + offs_f
        tl.store(sorted_pairs_ptr + rows, pad, mask=rows < max_rows)


@triton.jit
def _prefix_over_blocks(
    counts_ptr, totals_ptr, i0, num_blocks, num_ids,
    BLOCKS: tl.constexpr, IDS: tl.constexpr,
):  # fmt: skip
    """For the ids [i0, i0 + IDS): counts[b, id] becomes, in place, the pairs of id in the
    blocks before b (an exclusive prefix down each column); totals[id] gets all of them.
    In place is safe: an iteration loads its rows' tile before it stores any of it (the
    scan across rows orders the loads first) and iterations touch different rows."""
    offs_i = i0 + tl.arange(0, IDS)
    offs_b = tl.arange(0, BLOCKS)
    mask_i = offs_i < num_ids
    carry = tl.zeros((IDS,), dtype=tl.int32)  # pairs of each id in the blocks before b0
    for b0 in range(0, num_blocks, BLOCKS):
        rows = b0 + offs_b
        ptrs = counts_ptr + rows.to(tl.int64)[:, None] * num_ids + offs_i[None, :]
        mask = (rows < num_blocks)[:, None] & mask_i[None, :]
        c = tl.load(ptrs, mask=mask, other=0)  # (BLOCKS, IDS)
        tl.store(ptrs, carry[None, :] + tl.cumsum(c, axis=0) - c, mask=mask)
        carry += tl.sum(c, axis=0)
    tl.store(totals_ptr + offs_i, carry, mask=mask_i)


@triton.jit
def moe_count_prefix_kernel(
    counts_ptr, totals_ptr, num_blocks, num_ids,
    BLOCKS: tl.constexpr, IDS: tl.constexpr,
):  # fmt: skip
    """grid (cdiv(num_ids, IDS),): `_prefix_over_blocks` for IDS ids a program (the calls
    whose counts are too many for the one program of `moe_count_starts_kernel`)."""
    _prefix_over_blocks(
        counts_ptr, totals_ptr, tl.program_id(0) * IDS, num_blocks, num_ids, BLOCKS, IDS
    )


@triton.jit
def moe_count_starts_kernel(
    counts_ptr, totals_ptr, starts_ptr, ends_ptr, num_rows_ptr,
    num_blocks, num_ids, bound,
    BLOCK_M: tl.constexpr, SCAN: tl.constexpr, BLOCKS: tl.constexpr, IDS: tl.constexpr,
    CHUNK: tl.constexpr,
):  # fmt: skip
    """grid (1,): each id's padded rows, a running cumsum over the ids: starts/ends
    (num_ids,) its first and past-the-end row, num_rows (1,) the padded total. The used ids
    are numbered 0, 1, ... in id order; those numbered from `bound` on (a call using more
    ids than its caller promised) get no rows, so their pairs are left out. SCAN: first run
    `_prefix_over_blocks` over all ids here (few counts: saves the prefix launch)."""
    if SCAN:
        for i0 in range(0, num_ids, IDS):
            _prefix_over_blocks(counts_ptr, totals_ptr, i0, num_blocks, num_ids, BLOCKS, IDS)
        tl.debug_barrier()  # the totals are read back by other threads
    offs = tl.arange(0, CHUNK)
    rows = tl.full((), 0, dtype=tl.int32)  # padded rows of the ids below i0
    used_below = tl.full((), 0, dtype=tl.int32)  # used ids below i0
    for i0 in range(0, num_ids, CHUNK):
        mask = i0 + offs < num_ids
        total = tl.load(totals_ptr + i0 + offs, mask=mask, other=0)
        used = (total > 0).to(tl.int32)
        number = used_below + tl.cumsum(used, axis=0) - 1
        padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        padded = tl.where((used > 0) & (number < bound), padded, 0)
        end = rows + tl.cumsum(padded, axis=0)
        tl.store(starts_ptr + i0 + offs, end - padded, mask=mask)
        tl.store(ends_ptr + i0 + offs, end, mask=mask)
        rows += tl.sum(padded, axis=0)
        used_below += tl.sum(used, axis=0)
    tl.store(num_rows_ptr, rows)


@triton.jit
def moe_count_place_kernel(
    ids_ptr, counts_ptr, ranks_ptr, starts_ptr, ends_ptr, sorted_pairs_ptr, block_ids_ptr,
    num_pairs, num_ids, num_tiles, search_steps,
    BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    """grid (max(num_blocks, cdiv(num_tiles, TILES)),): program p places the pairs of block
    p, each to sorted_pairs[starts[id] + (pairs of id in the blocks before p) + its rank in
    p] (over the padding fill: an earlier launch), and sets block_ids of tiles
    [p * TILES, (p + 1) * TILES): the id whose rows hold the tile's first row (a binary
    search of ends, `search_steps` >= the bit length of num_ids), num_ids - 1 past num_rows
    (the GEMMs exit there)."""
    pid = tl.program_id(0)
    pairs = pid * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1)
    valid = (ids >= 0) & (ids < num_ids)
    start = tl.load(starts_ptr + ids, mask=valid, other=0)
    end = tl.load(ends_ptr + ids, mask=valid, other=0)
    keep = valid & (end > start)  # an id numbered from the bound on has no rows
    before = tl.load(counts_ptr + pid.to(tl.int64) * num_ids + ids, mask=keep, other=0)
    rank = tl.load(ranks_ptr + pairs, mask=keep, other=0)
    tl.store(sorted_pairs_ptr + start + before + rank, pairs, mask=keep)
    tiles = pid * TILES + tl.arange(0, TILES)
    mask_t = tiles < num_tiles
    first_row = tiles * BLOCK_M
    lo = tl.zeros((TILES,), dtype=tl.int32)  # ids [0, lo) end at or before first_row
    hi = tl.zeros((TILES,), dtype=tl.int32) + num_ids  # ids [hi, num_ids) end after it
    for _ in range(search_steps):
        active = lo < hi
        mid = (lo + hi) // 2
        mid_end = tl.load(ends_ptr + mid, mask=active & mask_t, other=0)
        lo = tl.where(active & (mid_end <= first_row), mid + 1, lo)
        hi = tl.where(active & (mid_end > first_row), mid, hi)
    tl.store(block_ids_ptr + tiles, tl.minimum(lo, num_ids - 1), mask=mask_t)
