"""Expert-offload kernels: `lookup` (one program: LRU slot assignment for a MoE call) and
`fill` (copies missed experts from device-mapped pinned host memory into their slots).
Semantics are those of the reference twins in `xinfer.offload.lookup`."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def lookup_kernel(
    ids_ptr,  # (N,) int32 routed expert ids, row-major (T, k)
    slot_ids_ptr,  # (N,) int32 out: slot ids
    num_ids,
    slot_of_expert_ptr,  # (E,) int32, -1 = absent
    expert_of_slot_ptr,  # (S,) int32, -1 = empty
    last_use_ptr,  # (S,) int64
    clock_ptr,  # (1,) int64
    scratch_ptr,  # (E,) int32 workspace
    miss_ids_ptr,  # (S,) int32 out
    miss_slots_ptr,  # (S,) int32 out
    miss_count_ptr,  # (1,) int32 out
    counters_ptr,  # (4,) int64: hits, misses, staging copies, calls
    num_experts,
    num_slots,
    BLOCK_E: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    NONE: tl.constexpr = 1 << 30  # "no position" sentinel
    e_offs = tl.arange(0, BLOCK_E)
    e_mask = e_offs < num_experts
    s_offs = tl.arange(0, BLOCK_S)
    s_mask = s_offs < num_slots

    # 1. First position of every expert in the call (NONE if it is not routed to).
    first = tl.full([BLOCK_E], NONE, tl.int32)
    for start in range(0, num_ids, BLOCK_N):
        n_offs = start + tl.arange(0, BLOCK_N)
        ids = tl.load(ids_ptr + n_offs, mask=n_offs < num_ids, other=-1)
        pos = tl.where(ids[None, :] == e_offs[:, None], n_offs[None, :], NONE)  # (E, N)
        first = tl.minimum(first, tl.min(pos, axis=1))
    soe = tl.load(slot_of_expert_ptr + e_offs, mask=e_mask, other=-1)
    is_hit_e = (first < NONE) & (soe >= 0)
    todo = (first < NONE) & (soe < 0)  # misses not yet given a slot
    num_hits = tl.sum(is_hit_e.to(tl.int32))
    num_misses = tl.minimum(tl.sum(todo.to(tl.int32)), num_slots - num_hits)

    # 2. Slots holding a hit: gather the per-expert hit flag through the scratch buffer.
    tl.store(scratch_ptr + e_offs, is_hit_e.to(tl.int32), mask=e_mask)
    tl.debug_barrier()
    eos = tl.load(expert_of_slot_ptr + s_offs, mask=s_mask, other=-1)
    hit_s = tl.load(scratch_ptr + eos, mask=s_mask & (eos >= 0), other=0) != 0
    clock = tl.load(clock_ptr) + 1
    last_use = tl.load(last_use_ptr + s_offs, mask=s_mask, other=0)
    last_use = tl.where(hit_s, clock, last_use)
    used = hit_s | (s_offs >= num_slots)

    # 3. Misses in order of first appearance take the (last_use, index)-smallest free slot.
    for m in range(0, num_misses):
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
        used = used | sel_s
        todo = todo & (e_offs != expert)
        tl.store(miss_ids_ptr + m, expert)
        tl.store(miss_slots_ptr + m, slot)

    tl.store(slot_of_expert_ptr + e_offs, soe, mask=e_mask)
    tl.store(expert_of_slot_ptr + s_offs, eos, mask=s_mask)
    tl.store(last_use_ptr + s_offs, last_use, mask=s_mask)
    tl.store(clock_ptr, clock)
    tl.store(miss_count_ptr, num_misses)
    tl.store(counters_ptr + 0, tl.load(counters_ptr + 0) + num_hits)
    tl.store(counters_ptr + 1, tl.load(counters_ptr + 1) + num_misses)
    tl.store(counters_ptr + 3, tl.load(counters_ptr + 3) + 1)
    tl.debug_barrier()

    # 4. Rewrite expert ids to slot ids (through the table just written).
    for start in range(0, num_ids, BLOCK_N):
        n_offs = start + tl.arange(0, BLOCK_N)
        n_mask = n_offs < num_ids
        ids = tl.load(ids_ptr + n_offs, mask=n_mask, other=0)
        slots = tl.load(slot_of_expert_ptr + ids, mask=n_mask, other=-1)
        tl.store(slot_ids_ptr + n_offs, slots, mask=n_mask)


@triton.jit
def fill_kernel(
    src_ptr,  # host expert tensor viewed as words: (E, row_words), device-mapped
    dst_ptr,  # slot tensor viewed as words: (S, row_words)
    miss_ids_ptr,  # (S,) int32
    miss_slots_ptr,  # (S,) int32
    miss_count_ptr,  # (1,) int32, read on the device: the grid is fixed
    row_words,
    BLOCK: tl.constexpr,
):
    m = tl.program_id(0)
    chunk_id = tl.program_id(1)
    if m < tl.load(miss_count_ptr):
        expert = tl.load(miss_ids_ptr + m).to(tl.int64)
        slot = tl.load(miss_slots_ptr + m).to(tl.int64)
        src = src_ptr + expert * row_words
        dst = dst_ptr + slot * row_words
        chunk = tl.cdiv(tl.cdiv(row_words, tl.num_programs(1)), BLOCK) * BLOCK
        begin = chunk_id * chunk
        end = tl.minimum(begin + chunk, row_words)
        for off in range(begin, end, BLOCK):
            offs = off + tl.arange(0, BLOCK)
            mask = offs < end
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
