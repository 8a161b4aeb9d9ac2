"""Continuous batching with chunked prefill: every step takes the running requests' decode
tokens first, then prompt chunks up to the token budget; new requests join at step
boundaries; when KV blocks run out the newest running request is preempted (recomputed).
With prefix caching, a request joining the batch first takes the cached blocks of its
longest computed prefix, and every block a step completes is offered to the cache.

A prompt longer than the budget runs as a *prompt pass* (runner/prompt_pass.py): all its
blocks at once, its budget-sized chunks run layer by layer (each layer's experts cross PCIe
once per prompt under offload), in one step when nothing else runs, else in one slice of
layers per step beside the others' decodes. The policy never depends on offload, so every
offload setting sees the same batches."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from xinfer.config import SchedulerConfig
from xinfer.engine.kv_cache import BlockAllocator
from xinfer.engine.prefix_cache import chain_hashes
from xinfer.engine.request import Request, RequestStatus
from xinfer.engine.state_cache import StateSlotAllocator


@dataclass(frozen=True)
class PassSlice:
    """Slice `index` of `num_slices` of a prompt pass over `num_tokens` tokens, computed in
    chunks of `chunk_tokens` (the step budget: the chunks the chunked path would run)."""

    index: int
    num_slices: int
    num_tokens: int
    chunk_tokens: int

    @property
    def is_last(self) -> bool:
        return self.index == self.num_slices - 1


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens computed for it this step (prompt chunk, or 1 when decoding;
    # a prompt pass: all its tokens in its last slice, 0 before)
    start: int = 0  # position of the first new token (tokens already cached)
    samples: bool = False  # the chunk reaches the end of the known tokens: sample one
    prompt_pass: PassSlice | None = None

    def __post_init__(self) -> None:
        self.start = self.request.num_computed_tokens
        self.samples = self.start + self.num_new_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    num_preempted: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def is_decode_only(self) -> bool:
        return all(s.num_new_tokens == 1 for s in self.scheduled)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        allocator: BlockAllocator,
        state_slots: StateSlotAllocator | None = None,
        layered_prompts: bool = True,
    ) -> None:
        """`state_slots`: hybrid models' recurrent-state slots, one per running request;
        `layered_prompts`: False runs long prompts chunk by chunk (no prompt passes)."""
        self.config, self.allocator, self.state_slots = config, allocator, state_slots
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0  # since start
        self.layered_prompts = layered_prompts
        self.prompt_pass: Request | None = None
        self.pass_slices = self.pass_next = self.pass_tokens = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def _grow(self, req: Request, num_new: int) -> bool:
        """Give `req` the blocks that `num_new` more tokens need; False if there are too few."""
        need = self.allocator.blocks_for(req.num_computed_tokens + num_new) - len(req.block_ids)
        needs_slot = self.state_slots is not None and req.state_slot < 0
        if needs_slot and self.state_slots.num_free == 0:
            return False
        if need <= 0:
            need = 0
        elif need > self.allocator.num_free:
            return False
        req.block_ids.extend(self.allocator.allocate(need))
        if needs_slot:
            req.state_slot = self.state_slots.allocate()
        return True

    def _take_cached_prefix(self, req: Request) -> int:
        """Give a request joining with nothing computed the cached blocks of its longest
        computed prefix; returns the tokens they hold. The block of its last known token
        is never taken: that token must be computed to sample the next one."""
        cache = self.allocator.prefix_cache
        if cache is None or req.num_computed_tokens or req.block_ids:
            return 0
        bs = self.allocator.block_size
        num_blocks = (req.num_tokens - 1) // bs
        chain_hashes(req.all_token_ids, bs, req.block_hashes, num_blocks)
        blocks = cache.lookup(req.block_hashes[:num_blocks])
        self.allocator.share(blocks)
        req.block_ids, req.num_cached_blocks = blocks, len(blocks)
        req.num_computed_tokens = len(blocks) * bs
        return req.num_computed_tokens

    def _count_prefix_query(self, req: Request, num_hit: int) -> None:
        cache = self.allocator.prefix_cache
        if cache is None:
            return
        if not req.output_token_ids:  # a first admission, not a preempted one's return
            req.num_cached_tokens = num_hit
        cache.stats.queries += req.num_tokens
        cache.stats.hits += num_hit

    def cache_computed_blocks(self, req: Request) -> None:
        """Offer the blocks that `req`'s computed tokens now fill to the prefix cache."""
        cache = self.allocator.prefix_cache
        bs = self.allocator.block_size
        num_full = req.num_computed_tokens // bs
        if cache is None or num_full <= req.num_cached_blocks:
            return
        chain_hashes(req.all_token_ids, bs, req.block_hashes, num_full)
        for i in range(req.num_cached_blocks, num_full):
            cache.insert(req.block_ids[i], req.block_hashes[i])
        req.num_cached_blocks = num_full

    def _release(self, req: Request) -> None:
        """Give back the request's KV blocks (cached ones stay in the prefix cache) and its
        recurrent-state slot."""
        self.allocator.free(req.block_ids)
        req.block_ids, req.num_cached_blocks = [], 0
        if req.state_slot >= 0 and self.state_slots is not None:
            self.state_slots.free(req.state_slot)
        req.state_slot = -1

    def _drop_blocks(self, req: Request) -> None:
        self._release(req)
        req.num_computed_tokens = 0

    def _preempt(self, req: Request) -> None:
        if req is self.prompt_pass:
            self.prompt_pass = None  # restarts from scratch when it is scheduled again
        self._drop_blocks(req)
        req.num_preemptions += 1
        self.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.running.remove(req)
        self.waiting.appendleft(req)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted = 0
        # Decodes first (one token each), then running requests still in their prefill.
        for req in sorted(self.running, key=lambda r: r.num_pending_tokens > 1):
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING or req is self.prompt_pass:
                continue  # preempted earlier in this loop, or scheduled below
            num_new = min(req.num_pending_tokens, budget)
            while not self._grow(req, num_new):
                taken = {id(s.request) for s in scheduled}
                others = [r for r in self.running if r is not req and id(r) not in taken]
                victim = others[-1] if others else req  # the newest one not yet scheduled
                self._preempt(victim)
                preempted += 1
                if victim is req:
                    break
            if req.status is RequestStatus.WAITING:
                continue
            scheduled.append(ScheduledRequest(req, num_new))
            budget -= num_new
        if self.prompt_pass is not None:  # its next slice takes the rest of the step
            scheduled.append(self._pass_slice())
            return SchedulerOutput(scheduled, preempted)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            if preempted:  # memory is short this step; let preempted work resume later
                break
            req = self.waiting[0]
            num_hit = self._take_cached_prefix(req)
            if self.layered_prompts and req.num_pending_tokens > self.config.max_num_batched_tokens:
                if not self._start_pass(req, num_hit, alone=not self.running and not scheduled):
                    break  # a pass needs all its blocks: wait for some to free up
                scheduled.append(self._pass_slice())
                break
            num_new = min(req.num_pending_tokens, budget)
            if not self._grow(req, num_new):
                self._drop_blocks(req)
                break
            self._count_prefix_query(req, num_hit)
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append(ScheduledRequest(req, num_new))
            budget -= num_new
        return SchedulerOutput(scheduled, preempted)

    def _start_pass(self, req: Request, num_hit: int, alone: bool) -> bool:
        """Admit `req` as a prompt pass with every block its pending tokens need: one slice
        when nothing else runs, else one per budget's worth of tokens."""
        if not self._grow(req, req.num_pending_tokens):
            self._drop_blocks(req)
            return False
        self._count_prefix_query(req, num_hit)
        self.waiting.popleft()
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        self.prompt_pass, self.pass_next = req, 0
        self.pass_tokens = req.num_pending_tokens
        budget = self.config.max_num_batched_tokens
        self.pass_slices = 1 if alone else -(-self.pass_tokens // budget)
        return True

    def _pass_slice(self) -> ScheduledRequest:
        """The prompt pass's next slice; the last one computes (and samples) its tokens."""
        budget = self.config.max_num_batched_tokens
        cut = PassSlice(self.pass_next, self.pass_slices, self.pass_tokens, budget)
        req = self.prompt_pass
        self.pass_next += 1
        if cut.is_last:
            self.prompt_pass = None
        return ScheduledRequest(req, cut.num_tokens if cut.is_last else 0, prompt_pass=cut)

    def finish(self, req: Request, reason: str) -> None:
        """Mark `req` finished and free its blocks (also used for aborts)."""
        if req.is_finished:
            return
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
        if req is self.prompt_pass:
            self.prompt_pass = None
        self._release(req)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
