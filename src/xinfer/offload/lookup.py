"""The offload algorithm in plain torch: the reference twins of the Triton `lookup` and `fill`
kernels (kernels/triton/offload.py). They run on CPU and are the ground truth the Triton
kernels are tested against, so the rules below are the contract of both, on every input.

Inputs: `topk_ids` (T, k), any integer dtype, duplicates allowed (within a row too).
- Ids must lie in [0, E). Where ids come from the host (CPU tensors, the reference path) an
  id outside raises `ValueError` before any table changes. On the device nothing can raise:
  ids come from `route_topk` (or a routing source), whose kernels only produce ids in range,
  and the lookup kernel clamps any id into [0, E) as it loads it, so a bad id can never make
  a kernel read or write out of bounds (it computes with expert clamp(id) instead).
- A call may route to at most `cache.capacity` (= S + overflow rows) distinct experts. The
  launcher checks this from the shape alone (T·k ≤ capacity, or capacity = E) and raises
  `ValueError` otherwise; the engine sizes the overflow so that its calls always fit.

Rules:
- the call's distinct expert ids are taken in order of first appearance in the row-major
  flattened `topk_ids`; the clock advances by one per call;
- a hit stamps `last_use[slot] = clock`;
- misses, in order of first appearance, take the slot with the smallest
  `(last_use, slot index)` among slots not used by this call (empty slots have
  `last_use = -1`, so they go first, lowest index first); the victim's expert becomes absent;
- when every slot is used by this call, the remaining misses (still in order of first
  appearance) get overflow rows `overflow_base + j`, j = 0, 1, ...; they do not enter the
  tables (the rows are reused by the next call);
- the ids are rewritten to rows of `cache.slots`; `miss_ids[m]`, `miss_slots[m]` (m-th miss
  in first-appearance order, slot or overflow row) and `miss_count` are written for `fill`;
- counters: hits and misses (distinct experts), one call, the overflow misses, and the
  largest number of misses of one call.

The `lfu` policy (`cache.policy`) changes only which slot a miss takes and whether it takes
one; everything else above holds:
- first, every expert's `score` decays, `score -= score >> LFU_SHIFT`, and each expert of
  the call gains `LFU_STEP`; `slot_score[s]` (the score of the expert in slot s, 0 when
  empty) follows the same arithmetic, so it stays equal to its expert's score;
- the m-th miss (m below the free slots) is offered the free slot of smallest key, empty
  slots first (by index), then `(slot_score, last_use, slot index)`; it takes it unless the
  slot holds an expert whose score exceeds the miss's and the overflow rows still have room
  for one more miss than the call already sends there; a miss not admitted gets the next
  overflow row and its victim keeps its expert but is offered to no later miss of the call
  (the m-th miss always meets the m-th victim in key order);
- overflow rows go to the misses not admitted (in order) and then to the misses beyond the
  free slots, so the miss list stays in first-appearance order.
"""

from __future__ import annotations

import torch

from xinfer.offload.packed import PackedExperts, unpack_rows_reference
from xinfer.offload.slot_cache import (
    CALLS,
    HITS,
    LFU_STEP,
    MAX_CALL_MISSES,
    MISSES,
    OVERFLOW,
    SlotCache,
    lfu_decay,
)


def check_call(cache: SlotCache, topk_ids: torch.Tensor) -> None:
    """Host-side checks that need no device read: the shape, and that the call's distinct
    experts cannot exceed the slots plus the overflow rows."""
    if topk_ids.dim() != 2:
        raise ValueError(f"lookup: topk_ids must be (T, k), got {tuple(topk_ids.shape)}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool:
        raise ValueError(f"lookup: topk_ids must be integers, got {topk_ids.dtype}")
    if cache.capacity < cache.num_experts and topk_ids.numel() > cache.capacity:
        raise ValueError(
            f"lookup: a call of {topk_ids.numel()} routed ids may need more than the "
            f"{cache.num_slots} slots and {cache.num_overflow} overflow rows of this layer"
        )


def check_id_range(topk_ids: torch.Tensor, num_experts: int) -> None:
    """Reject ids outside [0, E) (reads the ids: host tensors, or eager-only paths)."""
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= num_experts):
        bad = topk_ids[(topk_ids < 0) | (topk_ids >= num_experts)].reshape(-1)[0]
        raise ValueError(f"lookup: expert id {int(bad)} is outside [0, {num_experts})")


def lookup_reference(cache: SlotCache, topk_ids: torch.Tensor) -> torch.Tensor:
    """topk_ids (T, k) expert ids → (T, k) int32 rows of `cache.slots`; updates the tables."""
    check_call(cache, topk_ids)
    check_id_range(topk_ids, cache.num_experts)
    ids = topk_ids.reshape(-1).tolist()
    distinct = list(dict.fromkeys(ids))  # first-appearance order
    soe = cache.slot_of_expert.tolist()
    eos = cache.expert_of_slot.tolist()
    last_use = cache.last_use.tolist()
    clock = int(cache.clock.item()) + 1
    num_slots = cache.num_slots
    used = [False] * num_slots
    hits = [e for e in distinct if soe[e] >= 0]
    misses = [e for e in distinct if soe[e] < 0]
    num_lru = min(len(misses), num_slots - len(hits))
    lfu = cache.policy == "lfu"
    if lfu:
        score, slot_score = cache.score.tolist(), cache.slot_score.tolist()
        routed = set(distinct)
        score = [lfu_decay(x) + (LFU_STEP if e in routed else 0) for e, x in enumerate(score)]
        hit_slots = {soe[e] for e in hits}
        slot_score = [
            lfu_decay(x) + (LFU_STEP if s in hit_slots else 0) for s, x in enumerate(slot_score)
        ]
    for e in hits:
        last_use[soe[e]] = clock
        used[soe[e]] = True
    rows = {e: soe[e] for e in hits}
    miss_rows = []
    beyond = len(misses) - num_lru  # misses with no free slot: overflow rows in any case
    rejected = 0

    def key(s: int) -> tuple[int, ...]:
        if not lfu:
            return (last_use[s], s)
        return (-1, -1, s) if eos[s] < 0 else (slot_score[s], last_use[s], s)

    for e in misses[:num_lru]:
        victim = min((s for s in range(num_slots) if not used[s]), key=key)
        old = eos[victim]
        if lfu and old >= 0 and slot_score[victim] > score[e]:
            if rejected + beyond < cache.num_overflow:  # not admitted: a call-local row
                used[victim] = True
                rows[e] = cache.overflow_base + rejected
                rejected += 1
                miss_rows.append(rows[e])
                continue
        if old >= 0:
            soe[old] = -1
        eos[victim], soe[e], last_use[victim], used[victim] = e, victim, clock, True
        if lfu:
            slot_score[victim] = score[e]
        rows[e] = victim
        miss_rows.append(victim)
    for j, e in enumerate(misses[num_lru:]):
        rows[e] = cache.overflow_base + rejected + j
        miss_rows.append(rows[e])

    cache.slot_of_expert.copy_(torch.tensor(soe, dtype=torch.int32))
    cache.expert_of_slot.copy_(torch.tensor(eos, dtype=torch.int32))
    cache.last_use.copy_(torch.tensor(last_use, dtype=torch.int64))
    cache.clock.fill_(clock)
    if lfu:
        cache.score.copy_(torch.tensor(score, dtype=torch.int32))
        cache.slot_score.copy_(torch.tensor(slot_score, dtype=torch.int32))
    num_misses = len(misses)
    if num_misses:
        cache.miss_ids[:num_misses].copy_(torch.tensor(misses, dtype=torch.int32))
        cache.miss_slots[:num_misses].copy_(torch.tensor(miss_rows, dtype=torch.int32))
    cache.miss_count.fill_(num_misses)
    cache.counters[HITS] += len(hits)
    cache.counters[MISSES] += num_misses
    cache.counters[CALLS] += 1
    cache.counters[OVERFLOW] += beyond + rejected
    cache.counters[MAX_CALL_MISSES].clamp_(min=num_misses)
    slot_ids = torch.tensor([rows[e] for e in ids], dtype=torch.int32, device=cache.device)
    return slot_ids.view(topk_ids.shape)


def fill_reference(cache: SlotCache, host_tensors: dict[str, torch.Tensor | PackedExperts]) -> None:
    """Copy every missed expert's tensors from the host store into its row (slot or overflow);
    a packed tensor (offload/packed.py) is unpacked into it.

    Reads the miss count on the host, so on CUDA this path is eager-only (not graphable);
    the copies themselves are async copy-engine transfers from pinned memory."""
    num_misses = int(cache.miss_count.item())
    if num_misses == 0:
        return
    experts = cache.miss_ids[:num_misses].tolist()
    rows = cache.miss_slots[:num_misses].tolist()
    for name, host in host_tensors.items():
        dst = cache.slots[name]
        if isinstance(host, PackedExperts):
            unpack_rows_reference(host, dst, list(zip(experts, rows)))
            continue
        for e, r in zip(experts, rows):
            dst[r].copy_(host[e], non_blocking=True)
