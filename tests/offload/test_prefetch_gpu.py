"""GPU checks of cross-layer expert prefetch (offload/prefetch.py), whose CUDA path — the
prefetch fill on a side stream that forks from and joins the decode CUDA graphs — no CPU test
runs: the compiled prefetch kernels equal their twins; MoE layers over one slot pool with a
Prefetcher give the resident bits eagerly and replayed in a graph, with the CPU twin's tables,
counters and slot contents after every replay; and the engine's greedy output is
byte-identical with prefetch on (one and two layers ahead), off and without offload, in CUDA
graphs and eagerly, for the router's and the routing model's predictors, with statistics that
add up and prefetches issued by the replayed graphs."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from lru_model import random_expert_set, routing_stream
from prefetch_model import prediction_for
from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams
from xinfer.offload import kernels as offload_kernels
from xinfer.offload.executor import OffloadExecutor, ResidentExecutor
from xinfer.offload.host_store import HostExpertStore
from xinfer.offload.lookup import fill_reference, lookup_reference
from xinfer.offload.predictor import select, select_reference
from xinfer.offload.prefetch import Prefetcher
from xinfer.offload.prefetch_table import (
    NUM_PREFETCH_COUNTERS,
    PREFETCHED,
    USED,
    PrefetchTable,
    reserve,
    reserve_reference,
)
from xinfer.offload.slot_cache import NUM_COUNTERS, OVERFLOW, SlotCache
from xinfer.offload.slot_pool import build_slot_caches
from xinfer.routing.config import PRESETS
from xinfer.routing.parametric import popularity_draw
from xinfer.routing.parametric_ops import RoutingState, SequenceBatch, layer_constants
from xinfer.routing.predict import predict_model, predict_model_reference
from xinfer.runner.forward_context import ForwardContext, forward_context

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
CPU = torch.device("cpu")


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu().reshape(-1).view(torch.uint8), b.cpu().reshape(-1).view(torch.uint8))


def assert_slots_hold_their_experts(cache: SlotCache, host: dict, where) -> None:
    """Every occupied slot holds its expert's bytes (prefetched or filled: all joined)."""
    for s, e in enumerate(cache.expert_of_slot.tolist()):
        for name, t in host.items():
            assert e < 0 or same_bytes(cache.slots[name][s], t[e]), (where, name, s, e)


# --- the compiled kernels against their twins -------------------------------------------


@pytest.mark.parametrize(
    ("num_experts", "num_slots", "top_k", "policy"),
    [
        (16, 4, 2, "lru"),
        (60, 9, 4, "lru"),
        (128, 26, 8, "lru"),
        (128, 45, 8, "lru"),
        (60, 9, 4, "lfu"),
        (128, 13, 8, "lfu"),
    ],
)
def test_reserve_kernel_equals_twin(num_experts, num_slots, top_k, policy):
    """Adversarial predictions (right, wrong, -1, duplicates, wider than the slots) between
    lookups: tables, copy lists, counters, and the prefetch fill's bytes; LRU and `lfu`
    slots (whose reservation ranks and admits by the use counts)."""
    store = HostExpertStore(DEV)
    host = store.add_layer(random_expert_set(num_experts, seed=num_experts))
    ref = PrefetchTable(SlotCache(host, num_slots, CPU, policy=policy))
    tri = PrefetchTable(SlotCache(host, num_slots, DEV, policy=policy))
    rng = random.Random(num_slots)
    for step, ids in enumerate(routing_stream(rng, num_experts, num_slots, top_k, 60, 12)):
        pred = prediction_for(rng, ids, num_experts)
        reserve_reference(ref, pred)
        reserve(tri, pred.to(DEV))
        fill_reference(ref.fill_target(), host)
        offload_kernels.fill(tri.fill_target(), host)
        where = f"E={num_experts} S={num_slots} call {step}"
        for name, value in ref.cache.state().items():
            assert torch.equal(tri.cache.state()[name].cpu(), value), (where, name)
        n = int(ref.miss_count)
        assert int(tri.miss_count) == n, where
        assert torch.equal(tri.miss_ids[:n].cpu(), ref.miss_ids[:n]), where
        assert torch.equal(tri.miss_slots[:n].cpu(), ref.miss_slots[:n]), where
        assert torch.equal(tri.pending.cpu(), ref.pending), where
        assert torch.equal(tri.stamp.cpu(), ref.stamp), where
        assert torch.equal(tri.counters.cpu(), ref.counters), where
        assert_slots_hold_their_experts(tri.cache, host, where)
        lookup_reference(ref.cache, ids)  # the same lookup on both: the next settle sees it
        fill_reference(ref.cache, host)
        offload_kernels.lookup(tri.cache, ids.to(DEV))
        offload_kernels.fill(tri.cache, host)
    assert int(ref.counters[PREFETCHED]) > 0 and int(ref.counters[USED]) > 0
    store.close()


@pytest.mark.parametrize(("num_experts", "top_k", "margin"), [(16, 2, 0.0), (128, 8, 0.5)])
def test_select_kernel_equals_twin(num_experts, top_k, margin):
    g = torch.Generator().manual_seed(num_experts)
    scores = torch.randn(33, num_experts, generator=g)
    scores[3] = scores[3].to(torch.bfloat16).float().round()  # many ties
    keys = torch.arange(33, dtype=torch.int64)
    keys[[2, 6, 32]] = -1  # a graph's padding rows
    for dtype in (torch.float32, torch.bfloat16):
        s = scores.to(dtype)
        for k in (keys, None):
            want = select_reference(s, top_k, margin, k)
            got = select(s.to(DEV), top_k, margin, None if k is None else k.to(DEV))
            assert torch.equal(got.cpu(), want), (dtype, k is None)


def test_predict_model_kernel_matches_twin():
    """The routing model's predictor on a decode batch of continuing, repeating, fresh and
    padding rows. The GPU's fast log and cos differ from torch's in the last bits, so a
    near-tie may rank differently: at least 97% of the ids agree, padding predicts nothing."""
    num_experts, num_seqs = 128, 64
    g = torch.Generator().manual_seed(5)
    state = RoutingState.empty(num_seqs, num_experts, CPU)
    state.c.copy_(torch.randn(num_seqs + 1, num_experts, generator=g))
    state.key[:num_seqs] = torch.arange(num_seqs) + 100
    state.pos[:num_seqs] = torch.randint(1, 50, (num_seqs,), generator=g)
    keys = torch.arange(num_seqs) + 100
    keys[1::8] += 1000  # another request's row: a fresh draw
    keys[3::4] = -1  # padding
    # even rows continue their request (next position), odd rows repeat its last position
    pos = state.pos[:num_seqs] + torch.tensor([1, 0]).repeat(num_seqs // 2)
    batch = SequenceBatch(
        torch.arange(num_seqs + 1, dtype=torch.int32),
        (pos + 1).to(torch.int32),
        torch.arange(num_seqs, dtype=torch.int64),
        keys.to(torch.int64),
        True,
    )
    p = PRESETS["qwen3-30b-a3b"]
    const = layer_constants(3, 4, p.layer_scale(4), p.sigma, p.tau, p.phi,
                            popularity_draw(3, 4, num_experts))  # fmt: skip
    gpu_state = RoutingState(*(t.to(DEV) for t in (state.c, state.pos, state.key)))
    parts = (batch.query_start_loc, batch.seq_lens, batch.rows, batch.keys)
    gpu_batch = SequenceBatch(*(t.to(DEV) for t in parts), True)
    gpu_const = replace(const, popularity=const.popularity.to(DEV))
    for blur, margin in ((0.0, 0.0), (1.3, 0.5)):
        want = predict_model_reference(state, batch, const, 1234, blur, 8, margin)
        got = predict_model(gpu_state, gpu_batch, gpu_const, 1234, blur, 8, margin).cpu()
        assert (got[3::4] == -1).all() and (want[3::4] == -1).all()
        agree = (got == want).float().mean().item()
        assert agree >= 0.97, (blur, margin, agree)


# --- a Prefetcher over pooled layers, replayed in a CUDA graph ---------------------------

NUM_LAYERS, NUM_EXPERTS, NUM_SLOTS, TOP_K, HIDDEN, INTER = 4, 32, 8, 4, 128, 64
ROWS = 3  # 12 routed ids a layer against 8 slots: overflow rows too


def _expert_sets() -> list[dict[str, torch.Tensor]]:
    sets = []
    for i in range(NUM_LAYERS):
        g = torch.Generator().manual_seed(10 + i)
        w13 = torch.randn(NUM_EXPERTS, 2 * INTER, HIDDEN, generator=g).to(torch.bfloat16)
        w2 = torch.randn(NUM_EXPERTS, HIDDEN, INTER, generator=g).to(torch.bfloat16)
        sets.append({"w13": w13, "w2": w2})
    return sets


class _StaticPredictor:
    """Reads the prediction of each target layer from a tensor the test refills per step."""

    name = "static"

    def __init__(self, preds: torch.Tensor) -> None:
        self.preds = preds  # (L, ROWS, TOP_K) int32

    def __call__(self, target: int, hidden: torch.Tensor, ctx) -> torch.Tensor:
        return self.preds[target]


class _SideStaticPredictor(_StaticPredictor):
    """The same, run on the prefetch stream (as the router's predictor is): a copy there."""

    on_side_stream = True

    def __call__(self, target: int, hidden: torch.Tensor, ctx) -> torch.Tensor:
        return self.preds[target].clone()


def _prefetched_layers(
    sets,
    device: torch.device,
    distance: int,
    preds: torch.Tensor,
    copy_engine: bool = False,
    side_predictor: bool = False,
):
    """Offload executors over one slot pool (as the engine builds them; pinned on CUDA) with
    a Prefetcher attached → (executors, tables, lookup counters, host stores). `copy_engine`:
    captured fills (demand and prefetch) go through the copy-engine graph nodes."""
    store = HostExpertStore(device)
    hosts = [store.add_layer({k: v.clone() for k, v in s.items()}) for s in sets]
    counters = torch.zeros(NUM_LAYERS, NUM_COUNTERS, dtype=torch.int64, device=device)
    caches, _ = build_slot_caches(hosts, [NUM_SLOTS] * NUM_LAYERS, device, counters, 4096)
    executors = [OffloadExecutor(c, h, TOP_K, store=store) for c, h in zip(caches, hosts)]
    rows = torch.zeros(NUM_LAYERS, NUM_PREFETCH_COUNTERS, dtype=torch.int64, device=device)
    tables = [PrefetchTable(c, rows[i]) for i, c in enumerate(caches)]
    predictor = (_SideStaticPredictor if side_predictor else _StaticPredictor)(preds)
    prefetcher = Prefetcher(executors, tables, predictor, distance, ROWS, device)
    assert prefetcher.predictor_on_side == (side_predictor and device.type == "cuda")
    if copy_engine:
        from xinfer.offload.copy_engine import BounceBuffers, LayerCopies

        bounce = BounceBuffers(device)
        for c, h, x in zip(caches, hosts, executors):
            x.copies = LayerCopies(c, h, bounce)
        prefetcher.use_copy_engine()
    for i, x in enumerate(executors):
        x.prefetch = (prefetcher, i)
    return executors, tables, counters, hosts


def _decode_ctx(device: torch.device) -> ForwardContext:
    i32 = dict(dtype=torch.int32, device=device)
    return ForwardContext(
        slot_mapping=torch.full((ROWS,), -1, dtype=torch.int64, device=device),
        block_tables=torch.zeros(ROWS, 1, **i32),
        seq_lens=torch.ones(ROWS, **i32),
        query_start_loc=torch.arange(ROWS + 1, **i32),
        max_query_len=1,
        max_seq_len=1,
        request_keys=torch.arange(ROWS, dtype=torch.int64, device=device),
    )


def _guess(rng: random.Random, ids: torch.Tensor) -> torch.Tensor:
    """A (ROWS, k) prediction of `ids`: mostly right, some wrong, some withheld (-1)."""
    out = ids.clone().reshape(-1)
    for j in range(out.numel()):
        r = rng.random()
        if r < 0.25:
            out[j] = rng.randrange(NUM_EXPERTS)
        elif r < 0.4:
            out[j] = -1
    return out.view(ids.shape)


def _routed(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (ROWS, k) int32, weights (ROWS, k) float32) of one layer's call."""
    w, ids = torch.softmax(torch.randn(ROWS, NUM_EXPERTS, generator=g), -1).topk(TOP_K, -1)
    return ids.to(torch.int32), w / w.sum(-1, keepdim=True)


@pytest.mark.parametrize(
    "distance,copy_engine,side",
    [(1, False, False), (2, False, False), (1, True, False), (2, True, False), (2, False, True)],
    ids=["d1-kernel-fill", "d2-kernel-fill", "d1-copy-engine-fill", "d2-copy-engine-fill",
         "d2-side-stream-predictor"],
)  # fmt: skip
def test_prefetch_in_cuda_graph_equals_twin_and_resident(distance, copy_engine, side):
    """Four pooled layers, each prefetching the layer `distance` ahead on the side stream
    (`side`: the predictor too): a captured graph and an eager copy give the resident bf16
    bits every step, and after every replay the graph's tables, miss and prefetch counters,
    pending slots and slot bytes are the CPU twin's (the prefetch fills ran, in order,
    before their layers)."""
    sets = _expert_sets()
    resident = [ResidentExecutor({k: v.to(DEV) for k, v in s.items()}) for s in sets]
    static_x = torch.zeros(ROWS, HIDDEN, dtype=torch.bfloat16, device=DEV)
    static_ids = torch.zeros(NUM_LAYERS, ROWS, TOP_K, dtype=torch.int32, device=DEV)
    static_w = torch.zeros(NUM_LAYERS, ROWS, TOP_K, dtype=torch.float32, device=DEV)
    static_pred = torch.full((NUM_LAYERS, ROWS, TOP_K), -1, dtype=torch.int32, device=DEV)
    cpu_pred = static_pred.cpu()
    warm = _prefetched_layers(sets, DEV, distance, static_pred, side_predictor=side)[0]
    eager, eager_tables, eager_counters, _ = _prefetched_layers(
        sets, DEV, distance, static_pred, side_predictor=side
    )
    graphed, tables, counters, hosts = _prefetched_layers(
        sets, DEV, distance, static_pred, copy_engine, side_predictor=side
    )
    twin, twin_tables, twin_counters, _ = _prefetched_layers(sets, CPU, distance, cpu_pred)
    layers = range(NUM_LAYERS)
    with forward_context(_decode_ctx(DEV)):
        for i in layers:  # compile every kernel outside the capture
            warm[i](static_x, static_ids[i], static_w[i])
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = [graphed[i](static_x, static_ids[i], static_w[i]) for i in layers]
    assert int(counters.sum()) == 0  # capture records the kernels without running them
    g, rng = torch.Generator().manual_seed(distance), random.Random(distance)
    for step in range(40):
        x = torch.randn(ROWS, HIDDEN, generator=g).to(torch.bfloat16)
        routed = [_routed(g) for _ in layers]
        pred = torch.stack([_guess(rng, ids) for ids, _ in routed])
        ids_dev = [ids.to(DEV) for ids, _ in routed]
        w_dev = [w.to(DEV) for _, w in routed]
        static_x.copy_(x)
        static_pred.copy_(pred)
        cpu_pred.copy_(pred)
        for i in layers:
            static_ids[i].copy_(ids_dev[i]), static_w[i].copy_(w_dev[i])
        graph.replay()
        x_dev = x.to(DEV)
        with forward_context(_decode_ctx(DEV)):
            eager_out = [eager[i](x_dev, ids_dev[i], w_dev[i]) for i in layers]
        with forward_context(_decode_ctx(CPU)):
            for i in layers:  # the twin's bookkeeping: reservations, lookups and fills
                twin[i].load_experts(routed[i][0], x)
        torch.cuda.synchronize()
        for i in layers:
            want = resident[i](x_dev, ids_dev[i], w_dev[i])
            assert same_bytes(static_out[i], want), (step, i, "graph")
            assert same_bytes(eager_out[i], want), (step, i, "eager")
        for got, got_tables, got_counters, kind in (
            (graphed, tables, counters, "graph"),
            (eager, eager_tables, eager_counters, "eager"),
        ):
            where = (step, kind)
            assert torch.equal(got_counters.cpu(), twin_counters), where
            for i in layers:
                for name, value in twin[i].cache.state().items():
                    assert torch.equal(got[i].cache.state()[name].cpu(), value), (where, i, name)
                mine, ref = got_tables[i], twin_tables[i]
                assert torch.equal(mine.pending.cpu(), ref.pending), (where, i)
                assert torch.equal(mine.stamp.cpu(), ref.stamp), (where, i)
                assert torch.equal(mine.counters.cpu(), ref.counters), (where, i)
        for i in layers:
            assert_slots_hold_their_experts(graphed[i].cache, hosts[i], (step, i))
    prefetch_rows = torch.stack([t.counters for t in tables]).cpu()
    assert int(prefetch_rows[:, PREFETCHED].sum()) > 0 and int(prefetch_rows[:, USED].sum()) > 0
    assert int(prefetch_rows[:distance].sum()) == 0  # nothing predicts the first layers
    assert int(counters[:, OVERFLOW].sum()) > 0


# --- the engine: greedy bytes, statistics, graph replays ---------------------------------

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
PROMPTS = prompts(3, seed=1)  # 5, 17 and 9 tokens: the 17-token one runs as a prompt pass
ENGINE = dict(device="cuda:0", dtype="bfloat16", num_kv_blocks=64, max_num_seqs=4,
              max_num_batched_tokens=16)  # fmt: skip
# (fraction, prefetch distance, eager): 4 and 8 of 16 slots; a batch of 3 routes 6 ids
ROUTER_SETTINGS = [(0.25, 1, False), (0.25, 2, False), (0.25, 1, True), (0.25, 2, True),
                   (0.5, 1, False), (0.5, 2, False), (0.5, 1, True)]  # fmt: skip
MODEL_SETTINGS = [(0.25, 1, False), (0.5, 2, False), (0.25, 2, True)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = make_hf_model("qwen3_moe", seed=3, num_hidden_layers=6, num_experts=16)
    return str(write_checkpoint(model, tmp_path_factory.mktemp("qwen3_moe")))


def run_engine(path: str, engine: dict, **kw) -> dict:
    """Greedy tokens of the batched prompts, then of the first alone; with the engine, its
    offload stats, the graph replays and the eager forwards of decode steps."""
    llm = LLM(path, **engine, **kw)
    runner = llm.engine.runner
    count = {"replays": 0, "eager_decodes": 0}
    graphs = runner.graph_runner
    if graphs is not None:
        replay = graphs.run

        def counted_replay(*args, **kwargs):
            count["replays"] += 1
            return replay(*args, **kwargs)

        graphs.run = counted_replay
    forward = runner.forward

    def watched_forward(inp):
        count["eager_decodes"] += int(inp.ctx.is_decode)
        return forward(inp)

    runner.forward = watched_forward
    tokens = [r.token_ids for r in llm.generate(PROMPTS, GREEDY)]
    tokens.append(llm.generate(PROMPTS[0], GREEDY)[0].token_ids)
    return {"tokens": tokens, "llm": llm, "stats": llm.offload_stats(), **count}


def check_prefetch(run: dict, distance: int, predictor: str, eager: bool) -> dict:
    """The statistics add up, match the tables' pending slots, and decode really ran (and
    prefetched) in CUDA graphs unless `eager`."""
    stats, manager = run["stats"], run["llm"].engine.offload_manager
    pf = stats["prefetch"]
    assert pf["distance"] == distance and pf["predictor"] == predictor
    assert pf["predicted"] == pf["present"] + pf["prefetched"] + pf["dropped"], pf
    assert pf["prefetched"] == pf["used"] + pf["wasted"] + pf["pending"], pf
    tables = [t for t in manager.prefetcher.tables if t is not None]
    assert pf["pending"] == sum(int((t.pending >= 0).sum()) for t in tables), pf
    expert_bytes = manager.executors[0].cache.expert_bytes
    for key in ("prefetched", "used", "wasted"):
        assert pf[f"{key}_bytes"] == pf[key] * expert_bytes, key
    assert stats["bytes_moved"] == (
        stats["bytes_copied"] + stats["staging_bytes"] + pf["prefetched_bytes"]
    )
    for layer in stats["layers"][:distance]:  # nothing predicts the first layers
        assert layer["prefetch"]["predicted"] == 0
    assert pf["prefetched_bytes"] > 0, pf
    if eager:
        assert run["replays"] == 0 and run["eager_decodes"] > 0
    else:  # every decode step replayed a graph: the prefetches above were the graphs'
        assert run["replays"] > 0 and run["eager_decodes"] == 0, run
    return pf


@pytest.fixture(scope="module")
def router_base(checkpoint):
    return run_engine(checkpoint, ENGINE, enforce_eager=True)["tokens"]


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_router_prefetch_keeps_output_in_graphs(checkpoint, router_base, fraction):
    off = run_engine(checkpoint, ENGINE, moe_offload=fraction, moe_prefetch=0)
    assert off["tokens"] == router_base, f"offload {fraction} without prefetch changed output"
    assert "prefetch" not in off["stats"] and off["replays"] > 0
    on = run_engine(checkpoint, ENGINE, moe_offload=fraction)  # on by default: 2 ahead
    assert on["tokens"] == router_base, f"offload {fraction}, default prefetch changed output"
    assert on["llm"].engine.offload_manager.prefetcher.predictor_on_side  # the router's
    check_prefetch(on, 2, "router", False)
    for frac, distance, eager in ROUTER_SETTINGS:
        if frac != fraction:
            continue
        on = run_engine(checkpoint, ENGINE, moe_offload=frac, moe_prefetch=distance,
                        moe_prefetch_margin=0.0, enforce_eager=eager)  # fmt: skip
        where = f"fraction {frac}, distance {distance}, eager {eager}"
        assert on["tokens"] == router_base, f"output changed: {where}"
        check_prefetch(on, distance, "router", eager)


def test_lfu_prefetch_keeps_output_in_graphs(checkpoint, router_base):
    """Prefetch beside `lfu` slots, replayed in decode graphs: the tokens of no offload."""
    for frac, distance in [(0.25, 1), (0.5, 2)]:
        on = run_engine(checkpoint, ENGINE, moe_offload=frac, moe_offload_policy="lfu",
                        moe_prefetch=distance, moe_prefetch_margin=0.0)  # fmt: skip
        assert on["tokens"] == router_base, f"output changed: lfu, {frac}, distance {distance}"
        assert on["stats"]["policy"] == "lfu"
        check_prefetch(on, distance, "router", False)


def test_routing_model_prefetch_keeps_output_in_graphs(checkpoint, monkeypatch):
    """The routing model's predictor runs on the prefetch stream and reads state its target
    layer's routing advances on the main stream: the tokens are those of no offload, and
    every layer's prefetch statistics are those of the same run with the predictor on the
    main stream (a read that the advance overtook would predict other experts)."""
    from xinfer.routing.predict import ModelPredictor

    source = dict(routing_source="qwen3-30b-a3b")
    base = run_engine(checkpoint, ENGINE, enforce_eager=True, **source)["tokens"]
    side_stats = {}
    for frac, distance, eager in MODEL_SETTINGS:
        on = run_engine(checkpoint, ENGINE, moe_offload=frac, moe_prefetch=distance,
                        enforce_eager=eager, **source)  # fmt: skip
        where = f"fraction {frac}, distance {distance}, eager {eager}"
        assert on["tokens"] == base, f"output changed: {where}"
        assert on["llm"].engine.offload_manager.prefetcher.predictor_on_side
        pf = check_prefetch(on, distance, "routing-model", eager)
        assert pf["used"] > pf["wasted"], (where, pf)
        side_stats[frac, distance, eager] = [x["prefetch"] for x in on["stats"]["layers"]]
    monkeypatch.setattr(ModelPredictor, "on_side_stream", False)
    for frac, distance, eager in MODEL_SETTINGS:
        main = run_engine(checkpoint, ENGINE, moe_offload=frac, moe_prefetch=distance,
                          enforce_eager=eager, **source)  # fmt: skip
        assert not main["llm"].engine.offload_manager.prefetcher.predictor_on_side
        layers = [x["prefetch"] for x in main["stats"]["layers"]]
        assert layers == side_stats[frac, distance, eager], (frac, distance, eager)
