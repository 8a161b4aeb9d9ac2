"""Expert-prefetch kernels: `reserve_kernel` (one program: settles the last prefetch of a
layer and takes slots, LRU or LFU, for the predicted experts of its next call),
`select_kernel` (per token: the confident part of the top-k of a predictor's scores) and
`predict_model_kernel` (per token: the routing model's next draw of a layer, blurred to the
published recall). Semantics are those of the twins in `xinfer.offload.prefetch_table`,
`xinfer.offload.predictor` and `xinfer.routing.predict`."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.offload import take_lfu_slot, take_lru_slot
from xinfer.kernels.triton.routing_model import _mix32, _normal, _u32, _uniform


@triton.jit
def reserve_kernel(
    ids_ptr,  # (N,) int32 predicted expert ids, row-major (T, k); outside [0, E) = none
    num_ids,
    slot_of_expert_ptr,  # (E,) int32, -1 = absent
    expert_of_slot_ptr,  # (S,) int32, -1 = empty
    last_use_ptr,  # (S,) int64
    clock_ptr,  # (1,) int64, shared with the layer's lookup
    pending_ptr,  # (S,) int32: expert a prefetch put in the slot, not yet settled; -1 none
    stamp_ptr,  # (1,) int64: the clock of the last reservation
    miss_ids_ptr,  # (S,) int32 out: experts to copy
    miss_slots_ptr,  # (S,) int32 out: their slots
    miss_count_ptr,  # (1,) int32 out
    counters_ptr,  # (6,) int64: predicted, present, prefetched, dropped, used, wasted
    num_experts,
    num_slots,
    score_ptr,  # (E,) int32: `lfu`'s use counts (read only; unused under LRU)
    slot_score_ptr,  # (S,) int32: the score of each slot's expert (unused under LRU)
    BLOCK_E: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LFU: tl.constexpr = False,
    LFU_SHIFT: tl.constexpr = 3,
    LFU_STEP: tl.constexpr = 1024,
):
    NONE: tl.constexpr = 1 << 30
    e_offs = tl.arange(0, BLOCK_E)
    e_mask = e_offs < num_experts
    s_offs = tl.arange(0, BLOCK_S)
    s_mask = s_offs < num_slots
    n_offs = tl.arange(0, BLOCK_N)
    soe = tl.load(slot_of_expert_ptr + e_offs, mask=e_mask, other=-1)
    eos = tl.load(expert_of_slot_ptr + s_offs, mask=s_mask, other=-1)
    last_use = tl.load(last_use_ptr + s_offs, mask=s_mask, other=0)
    pending = tl.load(pending_ptr + s_offs, mask=s_mask, other=-1)
    stamp = tl.load(stamp_ptr)
    clock = tl.load(clock_ptr) + 1
    # every load that does not depend on another up front, so that they share one round
    # trip to memory: the counters' six read-modify-writes at the end cost six in a row,
    # and a one-program kernel pays each round trip in full (~50 µs beside a demand fill's
    # mapped reads against a 5.5 µs median, H100 trace 2026-12-06)
    c_offs = tl.arange(0, 8)
    totals = tl.load(counters_ptr + c_offs, mask=c_offs < 6, other=0)
    if LFU:
        score = tl.load(score_ptr + e_offs, mask=e_mask, other=0)
        slot_score = tl.load(slot_score_ptr + s_offs, mask=s_mask, other=0)

    # 1. Settle the last reservation: its experts still in their slots and stamped by a
    #    later lookup were used; the others were wasted.
    is_pending = pending >= 0
    is_used = is_pending & (eos == pending) & (last_use > stamp)
    num_used = tl.sum(is_used.to(tl.int64))
    num_wasted = tl.sum(is_pending.to(tl.int64)) - num_used
    pending = tl.full((BLOCK_S,), -1, tl.int32)

    # 2. First position of every predicted expert (NONE: not predicted).
    first = tl.full((BLOCK_E,), NONE, tl.int32)
    for start in range(0, num_ids, BLOCK_N):
        offs = start + n_offs
        ids = tl.load(ids_ptr + offs, mask=offs < num_ids, other=-1)
        ok = (offs < num_ids) & (ids >= 0) & (ids < num_experts)
        ids = tl.where(ok, ids, -2)
        pos = tl.where(ids[None, :] == e_offs[:, None], offs[None, :], NONE)  # (E, N)
        first = tl.minimum(first, tl.min(pos, axis=1))
    predicted = first < NONE
    present = predicted & (soe >= 0)
    todo = predicted & (soe < 0)
    num_present = tl.sum(present.to(tl.int32))
    num_todo = tl.sum(todo.to(tl.int32))
    num_lru = tl.minimum(num_todo, num_slots - num_present)
    # slots holding a predicted expert: stamped, and never a victim of this reservation
    hit_s = tl.max(((eos[:, None] == e_offs[None, :]) & present[None, :]).to(tl.int32), axis=1)
    hit_s = hit_s > 0
    last_use = tl.where(hit_s, clock, last_use)
    used = hit_s | (s_offs >= num_slots)

    # 3. Misses in order of first appearance take the (last_use, index)-smallest free slot;
    #    under LFU they are offered the slot the next lookup would rank first, ranked and
    #    admitted on the counts as that lookup will decay them (the counts do not change).
    num_copies = num_lru * 0  # int32 scalar
    if LFU:
        next_score = score - (score >> LFU_SHIFT) + LFU_STEP
        next_slot_score = slot_score - (slot_score >> LFU_SHIFT)
    for _ in range(0, num_lru):
        if LFU:
            expert, slot, sel_e, admit, todo, used, last_use, next_slot_score, eos, soe = (
                take_lfu_slot(
                    todo,
                    first,
                    used,
                    last_use,
                    next_slot_score,
                    next_score,
                    eos,
                    soe,
                    clock,
                    1,  # room: a refused prediction is dropped, it needs no overflow row
                    e_offs,
                    s_offs,
                    NONE,
                    BLOCK_S,
                )
            )
            sel_s = admit & (s_offs == slot)
            slot_score = tl.where(sel_s, tl.sum(tl.where(sel_e, score, 0)), slot_score)
        else:
            expert, slot, sel_s, todo, used, last_use, eos, soe = take_lru_slot(
                todo, first, used, last_use, eos, soe, clock, e_offs, s_offs, NONE, BLOCK_S
            )
            admit = num_copies >= 0  # always
        pending = tl.where(sel_s, expert, pending)
        tl.store(miss_ids_ptr + num_copies, expert, mask=admit)
        tl.store(miss_slots_ptr + num_copies, slot, mask=admit)
        num_copies += admit.to(tl.int32)

    tl.store(slot_of_expert_ptr + e_offs, soe, mask=e_mask)
    tl.store(expert_of_slot_ptr + s_offs, eos, mask=s_mask)
    tl.store(last_use_ptr + s_offs, last_use, mask=s_mask)
    tl.store(pending_ptr + s_offs, pending, mask=s_mask)
    if LFU:
        tl.store(slot_score_ptr + s_offs, slot_score, mask=s_mask)
    tl.store(clock_ptr, clock)
    tl.store(stamp_ptr, clock)
    tl.store(miss_count_ptr, num_copies)
    # predicted, present, prefetched, dropped, used, wasted
    num_predicted = tl.sum(predicted.to(tl.int64))
    add = tl.where(c_offs == 0, num_predicted, 0)
    add = tl.where(c_offs == 1, num_present.to(tl.int64), add)
    add = tl.where(c_offs == 2, num_copies.to(tl.int64), add)
    add = tl.where(c_offs == 3, (num_todo - num_copies).to(tl.int64), add)
    add = tl.where(c_offs == 4, num_used, add)
    add = tl.where(c_offs == 5, num_wasted, add)
    tl.store(counters_ptr + c_offs, totals + add, mask=c_offs < 6)


@triton.jit
def _select_confident(
    score, offs, mask, ids_ptr, tok, margin, valid, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr
):
    """Store the top-k of `score` (descending, ties: lowest index) whose score beats the
    (k+1)-th by more than `margin`; the other lanes (and invalid tokens) get -1."""
    offs_k = tl.arange(0, BLOCK_K)
    top_s = tl.zeros((BLOCK_K,), dtype=tl.float32)
    top_i = tl.zeros((BLOCK_K,), dtype=tl.int32)
    score = tl.where(mask, score, -float("inf"))
    for j in tl.static_range(TOP_K):
        best = tl.max(score, axis=0)
        idx = tl.min(tl.where(score == best, offs, 1 << 30), axis=0)
        top_s = tl.where(offs_k == j, best, top_s)
        top_i = tl.where(offs_k == j, idx, top_i)
        score = tl.where(offs == idx, -float("inf"), score)
    bar = tl.max(score, axis=0) + margin  # the (k+1)-th score (-inf when k = E)
    keep = (top_s > bar) & valid
    mask_k = offs_k < TOP_K
    tl.store(ids_ptr + tok * TOP_K + offs_k, tl.where(keep, top_i, -1), mask=mask_k)


@triton.jit
def select_kernel(
    scores_ptr, stride_t, keys_ptr, ids_ptr, num_experts, margin,
    HAS_KEYS: tl.constexpr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """grid (T,): a token's confident predicted ids from its scores (router logits); a token
    whose request key is -1 (a graph's padding row) predicts nothing."""
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    mask = offs < num_experts
    score = tl.load(scores_ptr + tok * stride_t + offs, mask=mask, other=0.0).to(tl.float32)
    valid = True
    if HAS_KEYS:
        valid = tl.load(keys_ptr + tok) >= 0
    _select_confident(score, offs, mask, ids_ptr, tok, margin, valid, TOP_K, BLOCK_K)


@triton.jit
def predict_model_kernel(
    seq_lens_ptr, rows_ptr, keys_ptr, state_c_ptr, state_pos_ptr, state_key_ptr,
    popularity_ptr, ids_ptr,
    num_experts, step_base, init_base, gumbel_base, blur_base,
    phi, innovation, drift_scale, blur, margin,
    TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """grid (B,), decode (one token per sequence): the layer's c for this token as
    `routing_state_kernel` will compute it (read only), its score
    `popularity + drift_scale·c + Gumbel` (the routing model's own draw), blurred by
    `blur`·N(0, 1) from a stream of its own, then the confident top-k."""
    b = tl.program_id(0).to(tl.int64)
    pos = tl.load(seq_lens_ptr + b).to(tl.int64) - 1
    key = tl.load(keys_ptr + b)
    row = tl.load(rows_ptr + b)
    offs = tl.arange(0, BLOCK_E)
    mask = offs < num_experts
    prev_c = tl.load(state_c_ptr + row * num_experts + offs, mask=mask, other=0.0)
    prev_pos = tl.load(state_pos_ptr + row)
    prev_key = tl.load(state_key_ptr + row)
    is_valid = key >= 0
    eps = _normal(_mix32(_mix32(step_base.to(tl.uint32) ^ _u32(key)) ^ _u32(pos)), offs)
    fresh = _normal(_mix32(_mix32(init_base.to(tl.uint32) ^ _u32(key)) ^ _u32(pos)), offs)
    is_same = is_valid & (prev_key == key)
    c = tl.where(is_same & (prev_pos == pos), prev_c, fresh)
    follows = is_same & (prev_pos == pos - 1) & (pos > 0)
    c = tl.where(follows, phi * prev_c + innovation * eps, c)
    h = _mix32(_mix32(gumbel_base.to(tl.uint32) ^ _u32(key)) ^ _u32(pos))
    g = -tl.log(-tl.log(_uniform(_mix32(h ^ offs.to(tl.uint32)))))
    pop = tl.load(popularity_ptr + offs, mask=mask, other=0.0)
    noise = _normal(_mix32(_mix32(blur_base.to(tl.uint32) ^ _u32(key)) ^ _u32(pos)), offs)
    score = pop + drift_scale * c + g + blur * noise
    _select_confident(score, offs, mask, ids_ptr, b, margin, is_valid, TOP_K, BLOCK_K)
