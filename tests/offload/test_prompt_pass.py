"""Prompt passes: the scheduler's policy (a prompt longer than the budget gets all its
blocks and runs in one step alone, or in ceil(T / budget) slices beside other requests'
decodes, nothing else admitted meanwhile; preemption and abort drop it), the runner's result
(the same tokens as the chunked path; a hybrid model's pass aborted between slices frees its
state slot), and the offload layer streamer on CPU (each layer's
non-resident experts copied once into the pool's one or two regions in turn, slots used in
place, LRU tables untouched, the MoE output equal to the resident one)."""

from __future__ import annotations

import pytest
import torch
from lru_model import random_expert_set
from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams
from xinfer.config import SchedulerConfig
from xinfer.engine.kv_cache import BlockAllocator
from xinfer.engine.request import Request
from xinfer.engine.scheduler import Scheduler
from xinfer.offload.executor import OffloadExecutor, ResidentExecutor
from xinfer.offload.lookup import fill_reference, lookup_reference
from xinfer.offload.slot_cache import NUM_COUNTERS, STAGING_COPIES, STREAMED
from xinfer.offload.slot_pool import build_slot_caches
from xinfer.offload.staging import LayerStreamer

CPU = torch.device("cpu")


def _scheduler(num_blocks: int = 64) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16)
    return Scheduler(config, BlockAllocator(num_blocks=num_blocks, block_size=4))


def _rows(out) -> list[tuple[str, int, object]]:
    return [(s.request.request_id, s.num_new_tokens, s.prompt_pass) for s in out.scheduled]


def test_long_prompt_alone_is_one_slice():
    sched = _scheduler()
    long = Request("long", list(range(40)), SamplingParams())
    sched.add(long)
    (row,) = sched.schedule().scheduled
    assert row.prompt_pass.num_slices == 1 and row.num_new_tokens == 40 and row.samples
    assert len(long.block_ids) == 10 and sched.prompt_pass is None  # all blocks at once


def test_long_prompt_beside_decodes_is_sliced():
    sched = _scheduler()
    short = Request("short", [1, 2, 3], SamplingParams())
    sched.add(short)
    sched.schedule()
    short.num_computed_tokens, short.output_token_ids = 3, [7]
    long, late = (
        Request("long", list(range(40)), SamplingParams()),
        Request("late", [5], SamplingParams()),
    )
    sched.add(long)
    sched.add(late)
    slices = []
    for _ in range(3):
        out = sched.schedule()
        (dec, pas) = out.scheduled  # the decode first, then the pass's slice; "late" waits
        assert dec.request is short and dec.num_new_tokens == 1 and pas.request is long
        slices.append((pas.prompt_pass.index, pas.prompt_pass.num_slices, pas.num_new_tokens))
        short.num_computed_tokens += 1
        short.output_token_ids.append(7)
        long.num_computed_tokens += pas.num_new_tokens
    long.output_token_ids.append(9)  # the token its last slice sampled
    assert slices == [(0, 3, 0), (1, 3, 0), (2, 3, 40)]
    assert out.scheduled[1].samples and list(sched.waiting) == [late]
    assert [s.request.request_id for s in sched.schedule().scheduled] == ["short", "long", "late"]


def test_preempted_or_aborted_pass_is_dropped():
    sched = _scheduler()
    long = Request("long", list(range(40)), SamplingParams())
    other = Request("other", [1, 2], SamplingParams())
    sched.add(other)
    sched.schedule()
    other.num_computed_tokens, other.output_token_ids = 2, [3]
    sched.add(long)
    sched.schedule()
    assert sched.prompt_pass is long
    sched._preempt(long)
    assert sched.prompt_pass is None and not long.block_ids and sched.waiting[0] is long
    out = sched.schedule()  # back in: the pass restarts from its first slice
    assert out.scheduled[-1].prompt_pass.index == 0
    sched.finish(long, "abort")
    assert sched.prompt_pass is None


def test_pass_equals_chunked_path(tmp_path):
    """A 70-token prompt with a 16-token budget: layer by layer over 5 chunks == chunk by
    chunk, bit for bit (the same kernel calls), resident and offloaded with two stream
    buffers and with one (every decoder layer MoE: each waits for the one before)."""
    path = write_checkpoint(make_hf_model("olmoe", seed=2, num_experts=16), tmp_path)
    prompt = (prompts(4, seed=6)[3] * 3)[:70]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = []
    for layered, frac, buffers in (
        (False, None, "auto"),
        (True, None, "auto"),
        (True, 0.25, "2"),
        (True, 0.25, "1"),
    ):
        llm = LLM(str(path), device="cpu", moe_offload=frac, max_num_batched_tokens=16,
                  moe_offload_stream_buffers=buffers)  # fmt: skip
        llm.engine.scheduler.layered_prompts = layered
        outs.append(llm.generate(prompt, params)[0].token_ids)
        if frac is not None:
            st = llm.offload_stats()
            assert st["staging_copies"] == st["num_layers"] and st["stream_buffers"] == int(buffers)
    assert outs[0] == outs[1] == outs[2] == outs[3]


def test_hybrid_pass_abort_between_slices(tmp_path):
    """Qwen3.5-MoE (linear attention, recurrent state): a 40-token pass sliced beside a
    decoding request, aborted after its first slice, gives back its blocks and state slot;
    the other request's tokens are those it gets alone; a second pass then runs exact."""
    path = write_checkpoint(make_hf_model("qwen3_5_moe", seed=5), tmp_path)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    llm = LLM(str(path), device="cpu", max_num_batched_tokens=16, moe_offload=0.25)
    short, long = prompts(1, seed=7)[0], (prompts(4, seed=8)[3] * 2)[:40]
    alone = [llm.generate(p, params)[0].token_ids for p in (short, long)]
    engine = llm.engine
    first = engine.add_request(short, params)
    got = []
    for out in engine.step():  # the short prompt's prefill and first token
        got += out.new_token_ids
    doomed = engine.add_request(long, params)
    for out in engine.step():  # a decode and the pass's first slice of three
        got += out.new_token_ids
    assert engine.scheduler.prompt_pass is not None
    engine.abort_request(doomed)
    again = engine.add_request(long, params)
    outputs = {first: got, again: []}
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] += out.new_token_ids
    assert [outputs[first], outputs[again]] == alone
    slots = engine.scheduler.state_slots
    assert (
        slots.num_free == slots.num_slots
        and engine.allocator.num_free == engine.allocator.num_blocks
    )


class _Layer(torch.nn.Module):
    def __init__(self, executor) -> None:
        super().__init__()
        self.executor = executor


@pytest.mark.parametrize("buffers", [1, 2])
def test_layer_streamer_on_cpu(buffers):
    """Three layers of one pool, each streamed once into the pool's regions in turn (one
    buffer: every layer into region 0, after the previous one's exit)."""
    num_layers, num_experts, num_slots = 3, 10, 3
    hosts = [random_expert_set(num_experts, seed=i) for i in range(num_layers)]
    counters = torch.zeros(num_layers, NUM_COUNTERS, dtype=torch.int64)
    caches, pools = build_slot_caches(
        hosts, [num_slots] * num_layers, CPU, counters, 64, stream_buffers=buffers
    )
    width = num_experts - num_slots
    assert pools[0].region_nbytes == buffers * width * caches[0].expert_bytes
    assert [len(c.stream_bases) for c in caches] == [buffers] * num_layers
    executors = [OffloadExecutor(c, h, top_k=2) for c, h in zip(caches, hosts)]
    for cache, host in zip(caches[:2], hosts):  # layers 0 and 1 hold some experts
        lookup_reference(cache, torch.tensor([[4, 7]], dtype=torch.int32))
        fill_reference(cache, host)
    tables = [c.state() for c in caches]
    streamer = LayerStreamer(CPU)
    streamer.begin([_Layer(x) for x in executors])
    for layer, (x, host) in enumerate(zip(executors, hosts)):
        streamer.enter(layer)
        rows, view = x.streamed
        for e in range(num_experts):  # every expert readable at its row
            for name, t in host.items():
                assert torch.equal(view[name][int(rows[e])], t[e]), (layer, e, name)
        held = x.cache.expert_of_slot.tolist()
        for s, e in enumerate(held):
            if e >= 0:
                assert int(rows[e]) == s  # in place
        base = x.cache.stream_bases[layer % buffers]  # the pool's regions in turn
        assert all(
            base <= int(rows[e]) < base + width or held[int(rows[e])] == -1
            for e in range(num_experts)
            if e not in held
        )
        streamer.exit(layer)
        assert x.streamed is None
    streamer.end()
    for cache, table, copied in zip(caches, tables, (8, 8, 10)):
        assert all(torch.equal(cache.state()[k], v) for k, v in table.items())
        assert int(cache.counters[STAGING_COPIES]) == 1 and int(cache.counters[STREAMED]) == copied


def _moe_set(num_experts: int, seed: int, hidden: int = 16, inter: int = 8) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "w13": torch.randn(num_experts, 2 * inter, hidden, generator=g),
        "w2": torch.randn(num_experts, hidden, inter, generator=g),
    }


class _Block(torch.nn.Module):
    """A decoder layer stand-in holding several MoE layers, run one after the other."""

    def __init__(self, executors) -> None:
        super().__init__()
        self.moes = torch.nn.ModuleList(_Layer(x) for x in executors)


def _streamed_outputs(sets, blocks, buffers, chunks, top_k=2):
    """The MoE outputs of each chunk through every MoE layer of `blocks` (lists of indices
    into `sets`), decoder layer by decoder layer with the streamer, `buffers` regions a pool
    (sets of one shape share a pool: `build_slot_caches` groups them)."""
    order = [i for block in blocks for i in block]
    hosts = [{k: v.clone() for k, v in sets[i].items()} for i in order]
    counters = torch.zeros(len(order), NUM_COUNTERS, dtype=torch.int64)
    slots = [3 if h["w13"].shape[0] == 10 else 5 for h in hosts]
    caches, pools = build_slot_caches(hosts, slots, CPU, counters, 64, stream_buffers=buffers)
    executors = [OffloadExecutor(c, h, top_k) for c, h in zip(caches, hosts)]
    for x, host in zip(executors[::2], hosts[::2]):  # some experts in slots, used in place
        lookup_reference(x.cache, torch.tensor([[1, 2]], dtype=torch.int32))
        fill_reference(x.cache, host)
    layers, start = [], 0
    for block in blocks:
        layers.append(_Block(executors[start : start + len(block)]))
        start += len(block)
    streamer, outs, k = LayerStreamer(CPU), [], 0
    streamer.begin(layers)
    for i, block in enumerate(blocks):
        streamer.enter(i)
        for _ in block:
            outs.append([executors[k](h, ids[k], w[k]) for h, ids, w in chunks])
            k += 1
        streamer.exit(i)
    streamer.end()
    assert all(int(c.counters[STAGING_COPIES]) == 1 for c in caches)
    return outs, pools


@pytest.mark.parametrize("buffers", [1, 2])
def test_streamed_pass_equals_resident(buffers):
    """Decoder layers that each run several MoE layers in a row (two shapes: two pools),
    streamed over three chunks: every output equals the resident one bit for bit, with one
    stream buffer as with two."""
    big = [_moe_set(10, seed=i) for i in range(3)]
    small = [_moe_set(12, seed=9 + i) for i in range(2)]
    sets = [big[0], small[0], big[1], small[1], big[2]]  # shapes A B | A B | A
    blocks = [[0, 1], [2, 3], [4]]
    g = torch.Generator().manual_seed(3)
    chunks = []
    for rows in (7, 16, 5):
        hidden = torch.randn(rows, 16, generator=g)
        ids = [torch.stack([torch.randperm(s["w13"].shape[0], generator=g)[:2]
                            for _ in range(rows)]).to(torch.int32) for s in sets]  # fmt: skip
        weights = [torch.softmax(torch.randn(rows, 2, generator=g), -1) for _ in sets]
        chunks.append((hidden, ids, weights))
    resident = [
        [ResidentExecutor(sets[i])(h, ids[i], w[i]) for h, ids, w in chunks] for i in range(5)
    ]
    outs, pools = _streamed_outputs(sets, blocks, buffers, chunks)
    assert [p.num_regions for p in pools] == [buffers, buffers]
    for i, (got, want) in enumerate(zip(outs, resident)):
        for a, b in zip(got, want):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (buffers, i)


def test_one_buffer_refuses_two_layers_of_a_pool_in_one_decoder_layer():
    """Two MoE layers of one shape in one decoder layer need both at once: with one stream
    buffer the streamer says so (naming the option), with two they run."""
    sets = [_moe_set(10, seed=i) for i in range(2)]
    hidden = torch.randn(4, 16)
    ids = [torch.tensor([[0, 5]] * 4, dtype=torch.int32)] * 2
    weights = [torch.full((4, 2), 0.5)] * 2
    chunks = [(hidden, ids, weights)]
    with pytest.raises(RuntimeError, match="--moe-offload-stream-buffers 2"):
        _streamed_outputs(sets, [[0, 1]], 1, chunks)
    outs, _ = _streamed_outputs(sets, [[0, 1]], 2, chunks)
    assert torch.equal(outs[1][0], ResidentExecutor(sets[1])(hidden, ids[1], weights[1]))
