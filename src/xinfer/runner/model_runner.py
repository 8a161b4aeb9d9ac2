"""Runs one scheduled step: packs the batch into flat tensors, sets the forward context,
runs the model (eagerly, or by replaying a captured CUDA graph for decode-only steps),
and samples the next token of every request whose known tokens are all in the cache.

Decode look-ahead: after queuing a decode step, the runner also queues the step after it,
fed by the sampled tokens still on the device, before it reads this step's tokens back. The
host's bookkeeping between two steps then overlaps the GPU's work. When the engine
schedules exactly that next step, its queued result is used; otherwise (a request
finished, a new one arrived) it is dropped: it only wrote KV slots of its own requests at
positions that are rewritten before anything reads them, and the random streams its
sampling drew from are put back, so nothing observable changes (seeded rows draw the same
numbers, in the same order, as without look-ahead). Rows with a grammar keep look-ahead: their
step is queued and only its sampling waits until their masks are known."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from xinfer.config import ModelConfig
from xinfer.engine.request import TokenLogprob
from xinfer.engine.scheduler import ScheduledRequest, SchedulerOutput
from xinfer.engine.state_cache import bind_state_caches
from xinfer.kv import turbo
from xinfer.kv.format import KVDtype, TurboQuant
from xinfer.kv.turbo import TurboKVCache
from xinfer.models.moe_decoder import MoeForCausalLM
from xinfer.runner.forward_context import ForwardContext, forward_context
from xinfer.runner.prompt_pass import LayerHooks, PromptPassRunner
from xinfer.runner.request_slots import RequestSlots, request_row_capacity
from xinfer.sampling import (
    PendingSample,
    RngSnapshot,
    SamplingMetadata,
    sample_async,
    uses_penalties,
)
from xinfer.structured import grammar_bitmask


def _token_slice(req, start: int, n: int) -> list[int]:
    """Tokens [start, start + n) of a request without concatenating prompt and output."""
    prompt = req.prompt_token_ids
    if start >= len(prompt):
        return req.output_token_ids[start - len(prompt) : start - len(prompt) + n]
    return req.all_token_ids[start : start + n]


@dataclass
class LookAhead:
    """A queued decode step: which (request, position) rows it computed, its tokens, and
    the random streams as they were before it sampled (restored if it is dropped). A step
    with grammar rows is queued without sampling (`pending` None): their masks need this
    step's tokens, so it samples its `logits` when it is claimed."""

    key: tuple[tuple[str, int], ...]
    pending: PendingSample | None
    rng: RngSnapshot | None
    logits: torch.Tensor | None = None


@dataclass
class HostBatch:
    """One step's tokens and metadata as host lists, packed back to back per request."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]  # flat KV slot of each token
    seq_lens: list[int]  # tokens in cache after this step, per request
    query_start_loc: list[int]
    logits_indices: list[int]  # rows that sample
    block_tables: list[list[int]]
    max_query_len: int
    state_ids: list[int] = field(default_factory=list)  # recurrent-state slot per request
    request_ids: list[str] = field(default_factory=list)  # per request
    request_rows: list[int] = field(default_factory=list)  # per request (RequestSlots)
    request_keys: list[int] = field(default_factory=list)  # per request (RequestSlots)

    @property
    def is_decode(self) -> bool:
        """One new token per request, every request samples."""
        return self.max_query_len == 1


def _allocate_kv_caches(
    model: MoeForCausalLM,
    cfg: ModelConfig,
    kv_dtype: KVDtype,
    model_dtype: torch.dtype | None,
    num_blocks: int,
    block_size: int,
    device: torch.device,
) -> list[tuple[torch.Tensor, torch.Tensor] | TurboKVCache]:
    """Each attention layer's cache, bound to it: a (K, V) pair of tensors (num_blocks,
    block_size, Hk, D) in `kv_dtype`, or one `TurboKVCache` for a TurboQuant format."""
    caches: list = []
    shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    for attn in model.attention_layers():
        if isinstance(kv_dtype, TurboQuant):
            cache = turbo.allocate(kv_dtype, *shape, model_dtype or torch.float32, device)
            attn.bind_kv_cache(cache)
            caches.append(cache)
            continue
        k = torch.zeros(shape, dtype=kv_dtype, device=device)
        v = torch.zeros(shape, dtype=kv_dtype, device=device)
        attn.bind_kv_cache(k, v)
        caches.append((k, v))
    return caches


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # (T,)
    positions: torch.Tensor  # (T,)
    ctx: ForwardContext
    logits_indices: torch.Tensor  # (S,) rows of the hidden states that sample


class ModelRunner:
    def __init__(
        self,
        model: MoeForCausalLM,
        cfg: ModelConfig,
        device: torch.device,
        num_blocks: int,
        block_size: int,
        kv_dtype: KVDtype,
        max_model_len: int,
        max_num_seqs: int = 64,
        graph_runner_factory=None,
        is_graph_safe=None,
        look_ahead: bool = False,
        observer=None,
        num_state_slots: int = 0,
        state_dtype: torch.dtype | None = None,
        state_copies: int = 1,
        layer_hooks: LayerHooks | None = None,
        model_dtype: torch.dtype | None = None,
    ) -> None:
        """`graph_runner_factory(runner)` builds the CUDA-graph runner (None: eager only);
        `is_graph_safe(batch_size)` says whether every layer can run that decode batch
        without a host decision (offload: the routed ids fit in the slots); `look_ahead`
        allows queuing the next greedy decode step before reading this one's tokens;
        `num_state_slots` requests' recurrent state is allocated for hybrid models' state
        layers (conv state in `state_dtype`; `state_copies` rows per request, 2 to allow
        look-ahead); `observer` (the routing recorder) hears `after_forward(request_ids,
        positions, query_start_loc)` after each forward, `pass_chunk(ctx, request_id, start,
        n)` for each chunk of a prompt pass and `end_pass()` after its last slice, and
        `after_step()` once a step's tokens are read. `kv_dtype` a TurboQuant format:
        each layer gets a `TurboKVCache` whose rotations run in `model_dtype`."""
        self.model, self.cfg, self.device = model, cfg, device
        self.block_size, self.max_model_len = block_size, max_model_len
        self.max_num_seqs = max_num_seqs
        self.is_graph_safe = is_graph_safe or (lambda batch_size: True)
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.request_slots = RequestSlots(request_row_capacity(max_num_seqs))
        self.observer = observer
        model_dtype = model_dtype or (kv_dtype if isinstance(kv_dtype, torch.dtype) else None)
        self.kv_caches = _allocate_kv_caches(
            model, cfg, kv_dtype, model_dtype, num_blocks, block_size, device
        )
        self.state_caches = bind_state_caches(
            model, num_state_slots, state_dtype or model_dtype or torch.float32, device,
            state_copies,
        )  # fmt: skip
        self.state_copies = state_copies
        self.graph_runner = graph_runner_factory(self) if graph_runner_factory else None
        self.look_ahead_enabled = look_ahead
        self.look_ahead: LookAhead | None = None
        self.look_ahead_counts = {"used": 0, "dropped": 0}
        # `layer_hooks`: the offload layer streamer of long prompts (None when resident)
        self.prompt_pass = PromptPassRunner(model, self.chunk_inputs, layer_hooks)

    def host_batch(self, out: SchedulerOutput) -> HostBatch:
        """The step's metadata as host lists (no device work yet)."""
        hb = HostBatch([], [], [], [], [0], [], [], 0)
        for s in out.scheduled:
            self._add_rows(hb, s.request, s.start, s.num_new_tokens, s.samples)
        return hb

    def _add_rows(self, hb: HostBatch, req, start: int, n: int, samples: bool) -> None:
        """Append tokens [start, start + n) of `req` to the batch."""
        bs = self.block_size
        hb.input_ids.extend(_token_slice(req, start, n))
        positions = range(start, start + n)
        hb.positions.extend(positions)
        hb.slots.extend(req.block_ids[p // bs] * bs + p % bs for p in positions)
        hb.seq_lens.append(start + n)
        hb.query_start_loc.append(hb.query_start_loc[-1] + n)
        hb.block_tables.append(req.block_ids)
        hb.state_ids.append(req.state_slot)
        hb.max_query_len = max(hb.max_query_len, n)
        self._add_request(hb, req.request_id)
        if samples:
            hb.logits_indices.append(hb.query_start_loc[-1] - 1)

    def _add_request(self, hb: HostBatch, request_id: str) -> None:
        row, key = self.request_slots.assign(request_id)
        hb.request_ids.append(request_id)
        hb.request_rows.append(row)
        hb.request_keys.append(key)

    def chunk_inputs(self, s: ScheduledRequest, start: int, n: int) -> StepInputs:
        """A prompt pass chunk: the inputs of a step that computes only tokens
        [start, start + n) of `s.request` (it samples when they end its known tokens)."""
        hb = HostBatch([], [], [], [], [0], [], [], 0)
        self._add_rows(hb, s.request, start, n, start + n == s.request.num_tokens)
        inp = self.to_device(hb)
        if self.observer is not None:
            self.observer.pass_chunk(inp.ctx, s.request.request_id, start, n)
        return inp

    def to_device(self, hb: HostBatch) -> StepInputs:
        # Block tables padded to a multiple of 16 columns: Triton specialises integer
        # arguments (the table's row stride) on divisibility by 16, and a width that is
        # not would compile the attention kernels again in the middle of a long prompt.
        width = -(-max(len(t) for t in hb.block_tables) // 16) * 16
        table = [t + [0] * (width - len(t)) for t in hb.block_tables]

        def dev(x: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(x, dtype=dtype).to(self.device, non_blocking=True)

        ctx = ForwardContext(
            slot_mapping=dev(hb.slots, torch.int64),
            block_tables=dev(table, torch.int32),
            seq_lens=dev(hb.seq_lens, torch.int32),
            query_start_loc=dev(hb.query_start_loc, torch.int32),
            max_query_len=hb.max_query_len,
            # Decode attention sizes its split grid from this bound; the model length (the
            # bound CUDA graphs are captured with) keeps eager and graphed bits identical.
            max_seq_len=self.max_model_len if hb.is_decode else max(hb.seq_lens),
            state_ids=dev(hb.state_ids, torch.int32) if self.state_caches else None,
            request_rows=dev(hb.request_rows, torch.int64),
            request_keys=dev(hb.request_keys, torch.int64),
        )
        return StepInputs(
            dev(hb.input_ids, torch.int64),
            dev(hb.positions, torch.int64),
            ctx,
            dev(hb.logits_indices, torch.int64),
        )

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        return self.to_device(self.host_batch(out))

    @torch.inference_mode()
    def forward(self, inp: StepInputs) -> torch.Tensor:
        """Hidden states (T, H) of the step, computed eagerly."""
        with forward_context(inp.ctx):
            return self.model(inp.input_ids, inp.positions)

    @torch.inference_mode()
    def logits(self, hb: HostBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor | None:
        """(S, V) float32 logits of the rows that sample (None when none does); a decode step
        that a captured graph covers runs the model and the LM head in one replay.
        `input_ids` (on the device) replaces the batch's host-side ids (look-ahead)."""
        if self.graph_runner is not None and self.graph_runner.can_run(hb):
            logits = self.graph_runner.run(hb, input_ids=input_ids)
            self._observe(hb)
            return logits
        inp = self.to_device(hb)
        if input_ids is not None:
            inp.input_ids = input_ids
        hidden = self.forward(inp)
        self._observe(hb)
        if not hb.logits_indices:
            return None
        if len(hb.logits_indices) < hidden.shape[0]:
            hidden = hidden[inp.logits_indices]
        return self.model.compute_logits(hidden)

    def _observe(self, hb: HostBatch) -> None:
        if self.observer is not None:
            self.observer.after_forward(hb.request_ids, hb.positions, hb.query_start_loc)

    @torch.inference_mode()
    def execute(
        self, out: SchedulerOutput, eos_ids: set[int], look_ahead: bool = False
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """Run the step; returns the sampled token (and logprobs) of each sampling request,
        in the order of `out.scheduled`. `look_ahead`: the caller expects the same batch to
        decode again (nothing waits to be scheduled), so the next step may be queued now."""
        if any(s.prompt_pass is not None for s in out.scheduled):
            return self._execute_with_pass(out, eos_ids)
        self.prompt_pass.state = None  # a pass shows in every step until done: this one ended
        return self._execute_rows(out, eos_ids, look_ahead)

    def _execute_rows(
        self, out: SchedulerOutput, eos_ids: set[int], look_ahead: bool = False
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        sampling = [s for s in out.scheduled if s.samples]
        queued, self.look_ahead = self.look_ahead, None
        if queued is not None and queued.key == _step_key(out):
            pending = queued.pending
            if pending is None:
                pending = self._sample([s.request for s in sampling], queued.logits, eos_ids)
            self.look_ahead_counts["used"] += 1
        else:
            if queued is not None:
                if queued.rng is not None:
                    queued.rng.restore()
                self.look_ahead_counts["dropped"] += 1
            logits = self.logits(self.host_batch(out))
            if not sampling:
                if self.observer is not None:
                    self.observer.after_step()
                return [], []
            pending = self._sample([s.request for s in sampling], logits, eos_ids)
        if look_ahead and self.look_ahead_enabled and self._can_look_ahead(out):
            self.look_ahead = self._queue_next_step(out, pending)
        result = pending.result()
        if self.observer is not None:
            self.observer.after_step()  # the step's work is done: its records are copied
        return result.token_ids, list(result.logprobs)

    def _sample(self, reqs: list, logits: torch.Tensor, eos_ids: set[int]) -> PendingSample:
        """Queue the sampling of one token per request from `logits` (rows in `reqs` order);
        rows with a grammar take only what their grammar allows after their known tokens."""
        meta = SamplingMetadata.build(
            [r.params for r in reqs],
            [r.prompt_token_ids for r in reqs],
            [r.output_token_ids for r in reqs],
            [r.generator for r in reqs],
            logits.shape[-1],
            self.device,
            eos_token_ids=eos_ids,
            allowed=grammar_bitmask([r.grammar for r in reqs], self.device),
        )
        return sample_async(logits, meta)

    def _execute_with_pass(
        self, out: SchedulerOutput, eos_ids: set[int]
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """A step with a prompt pass slice: the other rows run as a step of their own, then
        the slice; the pass samples after its last slice. Results in `out.scheduled` order."""
        rows = [s for s in out.scheduled if s.prompt_pass is None]
        tokens, logprobs = self._execute_rows(SchedulerOutput(rows), eos_ids) if rows else ([], [])
        (cut,) = [s for s in out.scheduled if s.prompt_pass is not None]
        hidden = self.prompt_pass.run(cut)
        if hidden is None:
            return tokens, logprobs
        if self.observer is not None:
            self.observer.end_pass()
        logits = self.model.compute_logits(hidden)
        result = self._sample([cut.request], logits, eos_ids).result()
        if self.observer is not None:
            self.observer.after_step()
        others = iter(zip(tokens, logprobs))
        merged = [
            (result.token_ids[0], result.logprobs[0]) if s is cut else next(others)
            for s in out.scheduled
            if s.samples
        ]
        return [t for t, _ in merged], [lp for _, lp in merged]

    def _queue_next_step(self, out: SchedulerOutput, pending: PendingSample) -> LookAhead:
        """Queue the decode step that follows `out`, its input ids the sampled tokens."""
        bs = self.block_size
        hb = HostBatch([], [], [], [], [0], [], [], 1)
        for row, s in enumerate(out.scheduled):
            req, pos = s.request, s.start + 1
            hb.input_ids.append(0)  # replaced on the device by the sampled token
            hb.positions.append(pos)
            hb.slots.append(req.block_ids[pos // bs] * bs + pos % bs)
            hb.seq_lens.append(pos + 1)
            hb.query_start_loc.append(row + 1)
            hb.logits_indices.append(row)
            hb.block_tables.append(req.block_ids)
            hb.state_ids.append(req.state_slot)
            self._add_request(hb, req.request_id)
        logits = self.logits(hb, input_ids=pending.token_ids_device)
        reqs = [s.request for s in out.scheduled]
        key = tuple((s.request.request_id, s.start + 1) for s in out.scheduled)
        if any(r.grammar is not None for r in reqs):
            return LookAhead(key, None, None, logits)  # sampled once the masks are known
        meta = SamplingMetadata.for_params(
            [r.params for r in reqs], [r.generator for r in reqs], logits.shape[-1], self.device
        )
        rng = RngSnapshot(meta, self.device)
        return LookAhead(key, sample_async(logits, meta), rng)

    def _can_look_ahead(self, out: SchedulerOutput) -> bool:
        """Every row decodes with nothing that needs the host between the steps: no penalty
        (it needs this step's token), no banned token, the next position in an allocated KV
        block, and no row that must stop at this step's token (the queued step would surely
        be dropped). Recurrent state must be double-buffered (`state_copies` 2): a queued
        step writes the other row, so a dropped one leaves the state it read intact."""
        if self.state_caches and self.state_copies < 2:
            return False
        if uses_penalties([s.request.params for s in out.scheduled]):
            return False
        for s in out.scheduled:
            req, p, pos = s.request, s.request.params, s.start + 1
            if not (s.num_new_tokens == 1 and s.samples):
                return False
            num_out = len(req.output_token_ids) + 1  # once this step's token is appended
            if num_out < p.min_tokens or num_out >= p.max_tokens:
                return False
            if pos + 1 >= self.max_model_len or pos // self.block_size >= len(req.block_ids):
                return False
        return True


def _step_key(out: SchedulerOutput) -> tuple[tuple[str, int], ...] | None:
    if not all(s.num_new_tokens == 1 and s.samples for s in out.scheduled):
        return None
    return tuple((s.request.request_id, s.start) for s in out.scheduled)
