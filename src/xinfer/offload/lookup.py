"""The offload algorithm in plain torch: the reference twins of the Triton `lookup` and `fill`
kernels (kernels/triton/offload.py). They run on CPU and are the ground truth the Triton
kernels are tested against, so the LRU rules below are the contract for both:

- the call's distinct expert ids are taken in order of first appearance in the row-major
  flattened `topk_ids`; the clock advances by one per call;
- a hit stamps `last_use[slot] = clock`;
- misses, in order of first appearance, take the slot with the smallest
  `(last_use, slot index)` among slots not used by this call (empty slots have
  `last_use = -1`, so they go first, lowest index first); the victim's expert becomes absent;
- the ids are rewritten to slot ids; `miss_ids[m]`, `miss_slots[m]` and `miss_count` are
  written for `fill`; the counters gain the hits, the misses and one call.
"""

from __future__ import annotations

import torch

from xinfer.offload.slot_cache import CALLS, HITS, MISSES, SlotCache


def count_distinct(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Number of distinct ids in `topk_ids`, as a 0-dim device tensor (no host sync)."""
    seen = torch.zeros(num_experts, dtype=torch.int32, device=topk_ids.device)
    seen.index_fill_(0, topk_ids.reshape(-1).long(), 1)
    return seen.sum()


def lookup_reference(cache: SlotCache, topk_ids: torch.Tensor) -> torch.Tensor:
    """topk_ids (T, k) expert ids → (T, k) int32 slot ids; updates the cache's tables."""
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
    if len(misses) > num_slots - len(hits):
        raise RuntimeError(
            f"lookup: {len(distinct)} distinct experts do not fit in {num_slots} slots; "
            "the caller should have used the staging path"
        )
    for e in hits:
        last_use[soe[e]] = clock
        used[soe[e]] = True
    miss_slots = []
    for e in misses:
        victim = min((last_use[s], s) for s in range(num_slots) if not used[s])[1]
        old = eos[victim]
        if old >= 0:
            soe[old] = -1
        eos[victim], soe[e], last_use[victim], used[victim] = e, victim, clock, True
        miss_slots.append(victim)

    dev = cache.device
    cache.slot_of_expert.copy_(torch.tensor(soe, dtype=torch.int32))
    cache.expert_of_slot.copy_(torch.tensor(eos, dtype=torch.int32))
    cache.last_use.copy_(torch.tensor(last_use, dtype=torch.int64))
    cache.clock.fill_(clock)
    num_misses = len(misses)
    if num_misses:
        cache.miss_ids[:num_misses].copy_(torch.tensor(misses, dtype=torch.int32))
        cache.miss_slots[:num_misses].copy_(torch.tensor(miss_slots, dtype=torch.int32))
    cache.miss_count.fill_(num_misses)
    cache.counters[HITS] += len(hits)
    cache.counters[MISSES] += num_misses
    cache.counters[CALLS] += 1
    slot_ids = torch.tensor([soe[e] for e in ids], dtype=torch.int32, device=dev)
    return slot_ids.view(topk_ids.shape)


def fill_reference(cache: SlotCache, host_tensors: dict[str, torch.Tensor]) -> None:
    """Copy every missed expert's tensors from the host store into its slot.

    Reads the miss count on the host, so on CUDA this path is eager-only (not graphable);
    the copies themselves are async copy-engine transfers from pinned memory."""
    num_misses = int(cache.miss_count.item())
    if num_misses == 0:
        return
    experts = cache.miss_ids[:num_misses].tolist()
    slots = cache.miss_slots[:num_misses].tolist()
    for name, host in host_tensors.items():
        dst = cache.slots[name]
        for e, s in zip(experts, slots):
            dst[s].copy_(host[e], non_blocking=True)
