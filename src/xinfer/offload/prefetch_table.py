"""Slot reservations for expert prefetch: the device state a layer's prefetch keeps beside its
`SlotCache`, `reserve_reference` (the pure-torch twin of `reserve_kernel` in
kernels/triton/prefetch.py; its docstring is the contract of both) and the launcher `reserve`.

A reservation runs in model order before the layer's next lookup (on CUDA on the prefetch
stream, which the lookup waits for; offload/prefetch.py); it changes only the layer's slot
tables and its own miss list, which the prefetch fill then copies from host memory into the
chosen slots."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from xinfer.kernels import use_triton
from xinfer.offload.slot_cache import LFU_SHIFT, LFU_STEP, SlotCache, lfu_decay

# Columns of a layer's prefetch counter row (int64, on the device; see offload/stats.py).
PREDICTED, PRESENT, PREFETCHED, DROPPED, USED, WASTED = range(6)
NUM_PREFETCH_COUNTERS = 6
RESERVE_NUM_WARPS = 4


class PrefetchTable:
    """One offloaded layer's prefetch state, all in device memory: `pending[S]` (the expert a
    prefetch put in the slot and no reservation has settled yet, -1 = none), `stamp` (the
    clock of the last reservation), the prefetch miss list `(miss_ids, miss_slots,
    miss_count)` the prefetch fill reads, and a counter row."""

    def __init__(self, cache: SlotCache, counters: torch.Tensor | None = None) -> None:
        self.cache = cache
        dev, s = cache.device, cache.num_slots
        i32 = dict(dtype=torch.int32, device=dev)
        self.pending = torch.full((s,), -1, **i32)  # (S,)
        self.stamp = torch.zeros(1, dtype=torch.int64, device=dev)
        self.miss_ids = torch.full((s,), -1, **i32)  # (S,) a reservation copies <= S experts
        self.miss_slots = torch.full((s,), -1, **i32)
        self.miss_count = torch.zeros(1, **i32)
        if counters is None:
            counters = torch.zeros(NUM_PREFETCH_COUNTERS, dtype=torch.int64, device=dev)
        if counters.shape != (NUM_PREFETCH_COUNTERS,):
            raise ValueError(f"prefetch counters must be one ({NUM_PREFETCH_COUNTERS},) row")
        self.counters = counters

    def fill_target(self) -> _FillTarget:
        """What `offload.kernels.fill` reads: the cache, with this table's miss list."""
        return _FillTarget(self)


class _FillTarget:
    """The layer's SlotCache seen through the prefetch miss list (so the unchanged fill
    launcher copies the prefetched experts)."""

    def __init__(self, table: PrefetchTable) -> None:
        self._cache = table.cache
        self.miss_ids, self.miss_slots = table.miss_ids, table.miss_slots
        self.miss_count = table.miss_count

    def __getattr__(self, name: str):
        return getattr(self._cache, name)


def reserve_reference(table: PrefetchTable, pred_ids: torch.Tensor) -> None:
    """Settle the last reservation, then take slots for the predicted experts of the layer's
    next call. `pred_ids` (T, k) int: predicted ids; entries outside [0, E) (the
    predictors write -1) predict nothing.

    Rules:
    - settle: a slot whose pending expert is still in it and whose `last_use` is later than
      the last reservation's stamp was used (a lookup hit it); every other pending slot was
      wasted (its expert was never hit, or a lookup evicted it). Pending is cleared.
    - the clock advances by one (the same clock as the lookup's); `stamp = clock`;
    - the distinct predicted experts are taken in order of first appearance in the
      row-major ids; those already in slots ("present") get `last_use = clock`;
    - the others, in order, take the slot with the smallest `(last_use, slot index)` among
      slots holding no predicted expert (so a reservation never evicts what it predicts);
      the victim's expert becomes absent; the slot gets `last_use = clock` and
      `pending = expert`; `(expert, slot)` goes to the miss list. When no such slot is left
      the remaining predicted experts are dropped (never overflow rows: the regions belong to
      the calls);
    - counters: predicted (distinct), present, prefetched, dropped, used, wasted.

    Under the `lfu` policy (`cache.policy`) a reservation changes no use count; it places as
    the next lookup would, were the prediction right: each absent predicted expert, in
    order, is offered the free slot of smallest key — empty slots first (by index), then
    `(decay(slot_score), last_use, slot index)` with `decay(x) = x - (x >> LFU_SHIFT)` — and
    takes it unless `decay(slot_score) > decay(score[e]) + LFU_STEP` (the lookup's admission
    test for a routed expert against an unrouted one); not admitted, it is dropped and its
    slot offered to no later expert of the reservation. An admitted expert's slot gets
    `slot_score = score[e]` (so a slot's score stays its expert's).

    Why no slot a call needs can be evicted: a layer's slots are needed only by that layer's
    own lookup → fill → GEMM, which runs after this reservation (on CUDA after the prefetch
    fill too: the executor waits for it before its lookup); the previous call of the layer
    finished before it (on CUDA the prefetch stream first waits for the main stream)."""
    cache = table.cache
    soe = cache.slot_of_expert.tolist()
    eos = cache.expert_of_slot.tolist()
    last_use = cache.last_use.tolist()
    pending = table.pending.tolist()
    stamp = int(table.stamp.item())
    num_used = sum(
        1 for s, e in enumerate(pending) if e >= 0 and eos[s] == e and last_use[s] > stamp
    )
    num_wasted = sum(1 for e in pending if e >= 0) - num_used
    pending = [-1] * cache.num_slots
    clock = int(cache.clock.item()) + 1
    ids = [e for e in pred_ids.reshape(-1).tolist() if 0 <= e < cache.num_experts]
    distinct = list(dict.fromkeys(ids))
    present = [e for e in distinct if soe[e] >= 0]
    todo = [e for e in distinct if soe[e] < 0]
    used = [False] * cache.num_slots
    for e in present:
        last_use[soe[e]], used[soe[e]] = clock, True
    num_offered = min(len(todo), cache.num_slots - len(present))
    lfu = cache.policy == "lfu"
    if lfu:
        score, slot_score = cache.score.tolist(), cache.slot_score.tolist()

    def key(s: int) -> tuple[int, ...]:
        if not lfu:
            return (last_use[s], s)
        return (-1, -1, s) if eos[s] < 0 else (lfu_decay(slot_score[s]), last_use[s], s)

    misses = []
    for e in todo[:num_offered]:
        victim = min((s for s in range(cache.num_slots) if not used[s]), key=key)
        used[victim] = True
        held = lfu and eos[victim] >= 0
        if held and lfu_decay(slot_score[victim]) > lfu_decay(score[e]) + LFU_STEP:
            continue  # not admitted: dropped
        if eos[victim] >= 0:
            soe[eos[victim]] = -1
        eos[victim], soe[e], last_use[victim] = e, victim, clock
        if lfu:
            slot_score[victim] = score[e]
        pending[victim] = e
        misses.append((e, victim))

    cache.slot_of_expert.copy_(torch.tensor(soe, dtype=torch.int32))
    cache.expert_of_slot.copy_(torch.tensor(eos, dtype=torch.int32))
    cache.last_use.copy_(torch.tensor(last_use, dtype=torch.int64))
    cache.clock.fill_(clock)
    if lfu:
        cache.slot_score.copy_(torch.tensor(slot_score, dtype=torch.int32))
    table.pending.copy_(torch.tensor(pending, dtype=torch.int32))
    table.stamp.fill_(clock)
    if misses:
        experts, slots = zip(*misses)
        table.miss_ids[: len(misses)].copy_(torch.tensor(experts, dtype=torch.int32))
        table.miss_slots[: len(misses)].copy_(torch.tensor(slots, dtype=torch.int32))
    table.miss_count.fill_(len(misses))
    for col, n in (
        (PREDICTED, len(distinct)),
        (PRESENT, len(present)),
        (PREFETCHED, len(misses)),
        (DROPPED, len(todo) - len(misses)),
        (USED, num_used),
        (WASTED, num_wasted),
    ):
        table.counters[col] += n


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def reserve(
    table: PrefetchTable,
    pred_ids: torch.Tensor,
    *,
    force_triton: bool = False,
    num_warps: int = RESERVE_NUM_WARPS,
) -> None:
    """Run the reservation: the Triton kernel on CUDA (one program, no host read: graph-safe),
    the twin elsewhere."""
    if pred_ids.dim() != 2:
        raise ValueError(f"reserve: pred_ids must be (T, k), got {tuple(pred_ids.shape)}")
    if pred_ids.dtype.is_floating_point or pred_ids.dtype == torch.bool:
        raise ValueError(f"reserve: pred_ids must be integers, got {pred_ids.dtype}")
    if not (force_triton or use_triton(table.pending)):
        reserve_reference(table, pred_ids)
        return
    from xinfer.kernels.triton.prefetch import reserve_kernel

    cache = table.cache
    ids = pred_ids.to(torch.int32).contiguous()
    block_e = _next_pow2(cache.num_experts)
    cap = max(8, min(1024, 2048 * num_warps // block_e))
    block_n = min(cap, max(8, _next_pow2(ids.numel())))
    on_cuda = table.pending.is_cuda
    with torch.cuda.device(table.pending.device) if on_cuda else nullcontext():
        reserve_kernel[(1,)](
            ids,
            ids.numel(),
            cache.slot_of_expert,
            cache.expert_of_slot,
            cache.last_use,
            cache.clock,
            table.pending,
            table.stamp,
            table.miss_ids,
            table.miss_slots,
            table.miss_count,
            table.counters,
            cache.num_experts,
            cache.num_slots,
            cache.score,
            cache.slot_score,
            BLOCK_E=block_e,
            BLOCK_S=_next_pow2(cache.num_slots),
            BLOCK_N=block_n,
            LFU=cache.policy == "lfu",
            LFU_SHIFT=LFU_SHIFT,
            LFU_STEP=LFU_STEP,
            num_warps=num_warps,
        )
