"""Expert-offload kernels: `lookup` (one program: slot assignment for a MoE call, LRU or LFU) and
`fill` (copies missed experts from device-mapped pinned host memory into their slots).
Semantics are those of the reference twins in `xinfer.offload.lookup`."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_ids(ids_ptr, offs, num_ids, num_experts):
    """Routed ids of one block; lanes past the call hold -2 (no expert). Ids outside
    [0, E) are clamped into it: a bad id can never address memory outside the tables."""
    mask = offs < num_ids
    ids = tl.load(ids_ptr + offs, mask=mask, other=0)
    ids = tl.minimum(tl.maximum(ids, 0), num_experts - 1)
    return tl.where(mask, ids, -2)


@triton.jit
def take_lru_slot(todo, first, used, last_use, eos, soe, clock, e_offs, s_offs,
                  NONE: tl.constexpr, BLOCK_S: tl.constexpr):  # fmt: skip
    """One miss placed: the `todo` expert of smallest first position takes the slot of
    smallest (last use, index) among those not `used`; its victim loses its slot. The one
    LRU step of the lookup and of the prefetch reservation (`prefetch.reserve_kernel`).
    Returns (expert, slot, sel_s, todo, used, last_use, eos, soe), the tables updated."""
    first_todo = tl.min(tl.where(todo, first, NONE))
    sel_e = todo & (first == first_todo)
    expert = tl.sum(tl.where(sel_e, e_offs, 0))
    key = tl.where(used, 0x7FFFFFFFFFFFFFFF, (last_use + 1) * BLOCK_S + s_offs)
    slot = (tl.min(key) % BLOCK_S).to(tl.int32)
    sel_s = s_offs == slot
    victim = tl.sum(tl.where(sel_s, eos, 0))
    soe = tl.where((e_offs == victim) & (victim >= 0), -1, soe)
    soe = tl.where(sel_e, slot, soe)
    eos = tl.where(sel_s, expert, eos)
    last_use = tl.where(sel_s, clock, last_use)
    return expert, slot, sel_s, todo & (e_offs != expert), used | sel_s, last_use, eos, soe


@triton.jit
def take_lfu_slot(todo, first, used, last_use, slot_score, score, eos, soe, clock, room,
                  e_offs, s_offs, NONE: tl.constexpr, BLOCK_S: tl.constexpr):  # fmt: skip
    """One miss offered a slot under the `lfu` policy: the `todo` expert of smallest first
    position meets the free slot of smallest key (empty slots first by index, then
    (slot score, last use, index)); it takes it unless the slot's expert scores higher and
    `room` (the overflow rows can take one more miss). Either way the slot is offered to no
    later miss. Returns (expert, slot, sel_e, admit, todo, used, last_use, slot_score, eos,
    soe), the tables updated."""
    first_todo = tl.min(tl.where(todo, first, NONE))
    sel_e = todo & (first == first_todo)
    expert = tl.sum(tl.where(sel_e, e_offs, 0))
    expert_score = tl.sum(tl.where(sel_e, score, 0))
    free = ~used
    rank_key = tl.where(eos < 0, -1, slot_score)  # empty slots first
    low = tl.min(tl.where(free, rank_key, 0x7FFFFFFF))
    tie = free & (rank_key == low)
    key = tl.where(tie, (last_use + 1) * BLOCK_S + s_offs, 0x7FFFFFFFFFFFFFFF)
    slot = (tl.min(key) % BLOCK_S).to(tl.int32)
    sel_s = s_offs == slot
    victim = tl.sum(tl.where(sel_s, eos, 0))
    admit = (victim < 0) | (low <= expert_score) | (room == 0)
    soe = tl.where(admit & (e_offs == victim) & (victim >= 0), -1, soe)
    soe = tl.where(admit & sel_e, slot, soe)
    eos = tl.where(admit & sel_s, expert, eos)
    last_use = tl.where(admit & sel_s, clock, last_use)
    slot_score = tl.where(admit & sel_s, expert_score, slot_score)
    todo = todo & (e_offs != expert)
    return expert, slot, sel_e, admit, todo, used | sel_s, last_use, slot_score, eos, soe


@triton.jit
def lookup_kernel(
    ids_ptr,  # (N,) int32 routed expert ids, row-major (T, k)
    slot_ids_ptr,  # (N,) int32 out: rows of the layer's slot view
    num_ids,
    slot_of_expert_ptr,  # (E,) int32, -1 = absent
    expert_of_slot_ptr,  # (S,) int32, -1 = empty
    last_use_ptr,  # (S,) int64
    clock_ptr,  # (1,) int64
    miss_ids_ptr,  # (capacity,) int32 out
    miss_slots_ptr,  # (capacity,) int32 out: slot or overflow row of each miss
    miss_count_ptr,  # (1,) int32 out
    counters_ptr,  # (7,) int64: hits, misses, staging, calls, overflow, max misses, streamed
    num_experts,
    num_slots,
    overflow_base,  # row of the first overflow row in the slot view
    score_ptr,  # (E,) int32: `lfu`'s decayed use counts (unused under LRU)
    slot_score_ptr,  # (S,) int32: the score of each slot's expert, 0 when empty
    num_overflow,  # overflow rows a call may use
    BLOCK_E: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LFU: tl.constexpr = False,
    LFU_SHIFT: tl.constexpr = 3,
    LFU_STEP: tl.constexpr = 1024,
):
    # Every table is read once, up front, so that the loads overlap; everything after that
    # works in registers (no scratch memory, no barrier): on a decode step this kernel is
    # latency, not work.
    NONE: tl.constexpr = 1 << 30  # "no position" sentinel
    e_offs = tl.arange(0, BLOCK_E)
    e_mask = e_offs < num_experts
    s_offs = tl.arange(0, BLOCK_S)
    s_mask = s_offs < num_slots
    n_offs = tl.arange(0, BLOCK_N)
    ids0 = _load_ids(ids_ptr, n_offs, num_ids, num_experts)
    soe = tl.load(slot_of_expert_ptr + e_offs, mask=e_mask, other=-1)
    eos = tl.load(expert_of_slot_ptr + s_offs, mask=s_mask, other=-1)
    last_use = tl.load(last_use_ptr + s_offs, mask=s_mask, other=0)
    clock = tl.load(clock_ptr) + 1
    hits_total = tl.load(counters_ptr + 0)
    misses_total = tl.load(counters_ptr + 1)
    calls_total = tl.load(counters_ptr + 3)
    overflow_total = tl.load(counters_ptr + 4)
    max_misses = tl.load(counters_ptr + 5)

    # 1. First position of every expert in the call (NONE if it is not routed to), and
    #    which slots hold a routed expert (those are the hits).
    pos = tl.where(ids0[None, :] == e_offs[:, None], n_offs[None, :], NONE)  # (E, N)
    first = tl.min(pos, axis=1)
    held = (ids0[None, :] == eos[:, None]) & (eos[:, None] >= 0)  # (S, N)
    hit_s = tl.max(held.to(tl.int32), axis=1) > 0
    for start in range(BLOCK_N, num_ids, BLOCK_N):
        offs = start + n_offs
        ids = _load_ids(ids_ptr, offs, num_ids, num_experts)
        pos = tl.where(ids[None, :] == e_offs[:, None], offs[None, :], NONE)
        first = tl.minimum(first, tl.min(pos, axis=1))
        held = (ids[None, :] == eos[:, None]) & (eos[:, None] >= 0)
        hit_s = hit_s | (tl.max(held.to(tl.int32), axis=1) > 0)
    is_hit_e = (first < NONE) & (soe >= 0)
    todo = (first < NONE) & (soe < 0)  # the misses
    num_hits = tl.sum(is_hit_e.to(tl.int32))
    num_todo = tl.sum(todo.to(tl.int32))
    num_lru = tl.minimum(num_todo, num_slots - num_hits)  # misses that get an LRU slot
    last_use = tl.where(hit_s, clock, last_use)
    used = hit_s | (s_offs >= num_slots)
    if LFU:  # decay every count, then count this call's experts
        score = tl.load(score_ptr + e_offs, mask=e_mask, other=0)
        slot_score = tl.load(slot_score_ptr + s_offs, mask=s_mask, other=0)
        score = score - (score >> LFU_SHIFT) + tl.where(first < NONE, LFU_STEP, 0)
        slot_score = slot_score - (slot_score >> LFU_SHIFT) + tl.where(hit_s, LFU_STEP, 0)

    # 2. Rank of every miss in first-appearance order (only needed when some overflow):
    #    an exclusive running count over the positions that first route to a miss.
    rank = tl.zeros((BLOCK_E,), dtype=tl.int32)
    if num_todo > num_lru:
        carry = num_todo * 0  # int32 scalar
        for start in range(0, num_ids, BLOCK_N):
            offs = start + n_offs
            ids = _load_ids(ids_ptr, offs, num_ids, num_experts)
            match = ids[None, :] == e_offs[:, None]  # (E, N)
            first_n = tl.sum(tl.where(match, first[:, None], 0), axis=0)
            todo_n = tl.sum(tl.where(match, todo[:, None].to(tl.int32), 0), axis=0)
            is_new = (first_n == offs) & (todo_n > 0) & (offs < num_ids)
            new_i = is_new.to(tl.int32)
            rank_n = carry + tl.cumsum(new_i, axis=0) - new_i
            rank += tl.sum(tl.where(match & is_new[None, :], rank_n[None, :], 0), axis=1)
            carry += tl.sum(new_i)
    lru_todo = todo & (rank < num_lru)
    over = todo & (rank >= num_lru)

    # 3. Misses in order of first appearance take the free slot of smallest key: LRU
    #    (last_use, index), or LFU (empty first, then score, last_use, index) with admission.
    beyond = num_todo - num_lru  # misses with no free slot
    rejected = num_todo * 0  # LFU misses not admitted (int32 scalar)
    rej_row = tl.full((BLOCK_E,), -1, tl.int32)  # their overflow rows, by expert
    for m in range(0, num_lru):
        if LFU:
            room = (rejected + beyond) < num_overflow
            expert, slot, sel_e, admit, lru_todo, used, last_use, slot_score, eos, soe = (
                take_lfu_slot(
                    lru_todo,
                    first,
                    used,
                    last_use,
                    slot_score,
                    score,
                    eos,
                    soe,
                    clock,
                    room,
                    e_offs,
                    s_offs,
                    NONE,
                    BLOCK_S,
                )
            )
            row = tl.where(admit, slot, overflow_base + rejected)
            rej_row = tl.where(sel_e & (admit == 0), row, rej_row)
            rejected += tl.where(admit, 0, 1)
        else:
            expert, row, sel_s, lru_todo, used, last_use, eos, soe = take_lru_slot(
                lru_todo, first, used, last_use, eos, soe, clock, e_offs, s_offs, NONE, BLOCK_S
            )
        tl.store(miss_ids_ptr + m, expert)
        tl.store(miss_slots_ptr + m, row)
    # The rest take overflow rows after the ones not admitted; a miss's place in the miss
    # list is its rank.
    over_row = overflow_base + rejected + rank - num_lru
    tl.store(miss_ids_ptr + rank, e_offs, mask=over)
    tl.store(miss_slots_ptr + rank, over_row, mask=over)
    row_of_e = tl.where(over, over_row, soe)
    if LFU:
        row_of_e = tl.where(rej_row >= 0, rej_row, row_of_e)

    tl.store(slot_of_expert_ptr + e_offs, soe, mask=e_mask)
    tl.store(expert_of_slot_ptr + s_offs, eos, mask=s_mask)
    tl.store(last_use_ptr + s_offs, last_use, mask=s_mask)
    tl.store(clock_ptr, clock)
    if LFU:
        tl.store(score_ptr + e_offs, score, mask=e_mask)
        tl.store(slot_score_ptr + s_offs, slot_score, mask=s_mask)
    tl.store(miss_count_ptr, num_todo)
    tl.store(counters_ptr + 0, hits_total + num_hits)
    tl.store(counters_ptr + 1, misses_total + num_todo)
    tl.store(counters_ptr + 3, calls_total + 1)
    tl.store(counters_ptr + 4, overflow_total + (beyond + rejected))
    tl.store(counters_ptr + 5, tl.maximum(max_misses, num_todo.to(tl.int64)))

    # 4. Rewrite expert ids to rows, from the table in registers.
    slots = tl.sum(tl.where(ids0[None, :] == e_offs[:, None], row_of_e[:, None], 0), axis=0)
    tl.store(slot_ids_ptr + n_offs, slots, mask=n_offs < num_ids)
    for start in range(BLOCK_N, num_ids, BLOCK_N):
        offs = start + n_offs
        ids = _load_ids(ids_ptr, offs, num_ids, num_experts)
        slots = tl.sum(tl.where(ids[None, :] == e_offs[:, None], row_of_e[:, None], 0), axis=0)
        tl.store(slot_ids_ptr + offs, slots, mask=offs < num_ids)


@triton.jit
def miss_block(b, per_expert, miss_ids_ptr, miss_slots_ptr):
    """Block `b` of a fill's work list (every missed expert's blocks in turn, `per_expert`
    blocks an expert): (its expert, the row it goes to, its block within the expert). The
    deal of the plain fill and of the packed one (offload_packed.py)."""
    m = b // per_expert
    expert = tl.load(miss_ids_ptr + m).to(tl.int64)
    slot = tl.load(miss_slots_ptr + m).to(tl.int64)
    return expert, slot, b - m * per_expert


@triton.jit
def _copy_row_block(src_ptr, dst_ptr, row_words, expert, slot, block, BLOCK: tl.constexpr):
    offs = block * BLOCK + tl.arange(0, BLOCK)
    mask = offs < row_words
    value = tl.load(src_ptr + expert * row_words + offs, mask=mask)
    tl.store(dst_ptr + slot * row_words + offs, value, mask=mask)


@triton.jit
def fill_kernel(
    # Up to eight expert tensors, each viewed as words: src (E, row_words) device-mapped host
    # memory, dst (S, row_words) slots. Unused ones are ignored (NUM_TENSORS). Eight covers
    # every format's set in one launch (NVFP4, asymmetric int4: six tensors).
    src0, dst0, words0, src1, dst1, words1, src2, dst2, words2, src3, dst3, words3,
    src4, dst4, words4, src5, dst5, words5, src6, dst6, words6, src7, dst7, words7,
    miss_ids_ptr,  # (capacity,) int32
    miss_slots_ptr,  # (capacity,) int32: rows of the slot view (slots or overflow)
    miss_count_ptr,  # (1,) int32, read on the device: the grid is fixed
    NUM_TENSORS: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    # The work is every BLOCK-word block of every missed expert's rows, all tensors in one
    # list; the programs deal it out round-robin. So one miss is spread over the whole grid
    # (as many loads in flight as eight misses would have), and a call without misses costs
    # one load per program. (The tensors' tests are written out, not a helper: in Triton's
    # CPU interpreter, which CI runs, a nested jit call per block cost 40% more time.)
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    n0 = tl.cdiv(words0, BLOCK)
    n1 = tl.cdiv(words1, BLOCK) if NUM_TENSORS > 1 else 0
    n2 = tl.cdiv(words2, BLOCK) if NUM_TENSORS > 2 else 0
    n3 = tl.cdiv(words3, BLOCK) if NUM_TENSORS > 3 else 0
    n4 = tl.cdiv(words4, BLOCK) if NUM_TENSORS > 4 else 0
    n5 = tl.cdiv(words5, BLOCK) if NUM_TENSORS > 5 else 0
    n6 = tl.cdiv(words6, BLOCK) if NUM_TENSORS > 6 else 0
    n7 = tl.cdiv(words7, BLOCK) if NUM_TENSORS > 7 else 0
    f1 = n0
    f2 = f1 + n1
    f3 = f2 + n2
    f4 = f3 + n3
    f5 = f4 + n4
    f6 = f5 + n5
    f7 = f6 + n6
    per_expert = f7 + n7
    total = tl.load(miss_count_ptr) * per_expert
    for b in range(pid, total, num_programs):
        expert, slot, r = miss_block(b, per_expert, miss_ids_ptr, miss_slots_ptr)
        if r < n0:
            _copy_row_block(src0, dst0, words0, expert, slot, r, BLOCK)
        if NUM_TENSORS > 1:
            if (r >= f1) & (r < f1 + n1):
                _copy_row_block(src1, dst1, words1, expert, slot, r - f1, BLOCK)
        if NUM_TENSORS > 2:
            if (r >= f2) & (r < f2 + n2):
                _copy_row_block(src2, dst2, words2, expert, slot, r - f2, BLOCK)
        if NUM_TENSORS > 3:
            if (r >= f3) & (r < f3 + n3):
                _copy_row_block(src3, dst3, words3, expert, slot, r - f3, BLOCK)
        if NUM_TENSORS > 4:
            if (r >= f4) & (r < f4 + n4):
                _copy_row_block(src4, dst4, words4, expert, slot, r - f4, BLOCK)
        if NUM_TENSORS > 5:
            if (r >= f5) & (r < f5 + n5):
                _copy_row_block(src5, dst5, words5, expert, slot, r - f5, BLOCK)
        if NUM_TENSORS > 6:
            if (r >= f6) & (r < f6 + n6):
                _copy_row_block(src6, dst6, words6, expert, slot, r - f6, BLOCK)
        if NUM_TENSORS > 7:
            if (r >= f7) & (r < f7 + n7):
                _copy_row_block(src7, dst7, words7, expert, slot, r - f7, BLOCK)
