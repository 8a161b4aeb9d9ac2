"""GPU checks of expert offload (run on the H200 test machine): the Triton lookup and fill
equal their twins on random routing streams with a real pinned, mapped host store, including
calls that route to more distinct experts than there are slots (overflow rows); both replay
inside CUDA graphs at such widths; MoE layers over one slot pool give the same bf16 bytes
eagerly, in a graph and without offload; the prompt pass's layer streaming (side stream,
double-buffered) equals the resident layers; the engine's greedy output is unchanged."""

from __future__ import annotations

import random

import pytest
import torch
from lru_model import routing_stream

from xinfer.offload import kernels as offload_kernels
from xinfer.offload.executor import OffloadExecutor, ResidentExecutor
from xinfer.offload.host_store import HostExpertStore
from xinfer.offload.lookup import fill_reference, lookup_reference
from xinfer.offload.packed import PackedExperts, pack_layer
from xinfer.offload.slot_cache import MISSES, NUM_COUNTERS, OVERFLOW, STAGING_COPIES, SlotCache
from xinfer.offload.slot_pool import build_slot_caches
from xinfer.offload.staging import LayerStreamer

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
CPU = torch.device("cpu")


def expert_set(num_experts: int, seed: int, hidden: int = 64, inter: int = 32) -> dict:
    """Host tensors of mixed dtypes: bf16 weights, fp8, uint8 and fp16 'scales', odd sizes;
    nine tensors, so the fill takes two launches (eight tensors, then one)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "w13": torch.randn(num_experts, 2 * inter, hidden, generator=g).to(torch.bfloat16),
        "w2": torch.randn(num_experts, hidden, inter, generator=g).to(torch.bfloat16),
        "s8": torch.randn(num_experts, 5, 7, generator=g).to(torch.float8_e4m3fn),
        "u8": torch.randint(0, 255, (num_experts, 13), generator=g, dtype=torch.uint8),
        "f16": torch.randn(num_experts, 3, 3, generator=g).to(torch.float16),
        "z13": torch.randint(0, 15, (num_experts, 2 * inter, 3), generator=g, dtype=torch.uint8),
        "z2": torch.randint(0, 15, (num_experts, 11), generator=g, dtype=torch.uint8),
        "f32": torch.randn(num_experts, 2 * inter, generator=g),
        "i32": torch.randint(0, 9, (num_experts, 2, 9), generator=g, dtype=torch.int32),  # 2nd
    }


def assert_same(gpu: SlotCache, cpu: SlotCache, host: dict, rows: torch.Tensor, ids, where):
    for name, value in cpu.state().items():
        assert torch.equal(gpu.state()[name].cpu(), value), (where, name)
    n = int(cpu.miss_count)
    assert int(gpu.miss_count) == n, where
    assert torch.equal(gpu.miss_ids[:n].cpu(), cpu.miss_ids[:n]), where
    assert torch.equal(gpu.miss_slots[:n].cpu(), cpu.miss_slots[:n]), where
    assert torch.equal(gpu.counters.cpu(), cpu.counters), where
    for e, r in zip(ids.reshape(-1).tolist(), rows.reshape(-1).tolist()):
        for name, t in host.items():  # every row the MoE kernel reads holds its expert
            want = t.unpack_row(e) if isinstance(t, PackedExperts) else t[e]
            got = gpu.slots[name][r].cpu().view(torch.uint8)
            assert torch.equal(got, want.view(torch.uint8)), (where, name, e, r)


def run_against_twins(gpu: SlotCache, cpu: SlotCache, host: dict, stream) -> None:
    """Each call of `stream` through the kernels (gpu) and the twins (cpu): same rows, same
    tables and slot bytes."""
    for step, ids in enumerate(stream):
        want = lookup_reference(cpu, ids)
        fill_reference(cpu, host)
        got = offload_kernels.lookup(gpu, ids.to(DEV))
        offload_kernels.fill(gpu, host)
        assert torch.equal(got.cpu(), want), step
        assert_same(gpu, cpu, host, want, ids, f"call {step}")


@pytest.mark.parametrize(
    "num_experts,num_slots,top_k",
    [(8, 2, 2), (64, 16, 8), (128, 32, 8), (128, 128, 8), (512, 40, 10), (60, 9, 4)],
)
@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_triton_lookup_and_fill_equal_twins(num_experts, num_slots, top_k, policy):
    store = HostExpertStore(DEV)
    host = store.add_layer(expert_set(num_experts, seed=num_experts))
    assert all(t.is_pinned() for t in host.values())
    gpu = SlotCache(host, num_slots, DEV, policy=policy)
    cpu = SlotCache(host, num_slots, CPU, policy=policy)
    stream = routing_stream(random.Random(num_slots), num_experts, num_slots, top_k, 150)
    run_against_twins(gpu, cpu, host, stream)
    if num_slots < num_experts:
        assert int(gpu.counters[OVERFLOW]) > 0  # the stream had calls wider than the slots
    store.close()


def replay_lookup_and_fill(
    rows: int, make_fill, seed: int, steps: int = 60, policy: str = "lru"
) -> set[int]:
    """A graph of lookup + fill (`make_fill(cache, host)` → the fill to capture) replayed on
    random calls of `rows` tokens (every tenth repeats the last: all hits where the calls fit
    the slots) equals the CPU twins after every replay; returns the miss counts seen."""
    num_experts, num_slots, top_k = 64, 16, 8
    store = HostExpertStore(DEV)
    host = store.add_layer(expert_set(num_experts, seed=seed))
    gpu = SlotCache(host, num_slots, DEV, policy=policy)
    cpu = SlotCache(host, num_slots, CPU, policy=policy)
    fill = make_fill(gpu, host)
    static_ids = torch.zeros(rows, top_k, dtype=torch.int32, device=DEV)
    warm = SlotCache(host, num_slots, DEV, policy=policy)
    offload_kernels.lookup(warm, static_ids)  # compile outside capture
    offload_kernels.fill(warm, host)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_rows = offload_kernels.lookup(gpu, static_ids)
        fill()
    # Capture records the kernels without running them: the tables are still empty.
    rng, misses_seen, ids = random.Random(seed * 100 + rows), set(), None
    for step in range(steps):
        if ids is None or step % 10 != 9:
            ids = torch.tensor([rng.sample(range(num_experts), top_k) for _ in range(rows)])
        static_ids.copy_(ids.to(torch.int32))
        graph.replay()
        want = lookup_reference(cpu, ids.to(torch.int32))
        fill_reference(cpu, host)
        torch.cuda.synchronize()
        misses_seen.add(int(cpu.miss_count))
        assert torch.equal(static_rows.cpu(), want), step
        assert_same(gpu, cpu, host, want, ids, f"replay {step}")
    overflow = int(gpu.counters[OVERFLOW])
    if rows * top_k > num_slots:  # 8 rows of 8 of 64: more experts than slots, every call misses
        assert overflow > 0 and min(misses_seen) > 0
    elif policy == "lru":  # every call fits: nothing overflows, each repeated call hits all
        assert overflow == 0 and 0 in misses_seen
    # (`lfu` serves a refused miss from an overflow row even when the call fits the slots,
    # and a repeated call may miss it again: the twin comparison above is the check)
    store.close()
    return misses_seen


@pytest.mark.parametrize("rows", [2, 8])  # 16 and 64 routed ids against 16 slots
@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_lookup_and_fill_replay_in_cuda_graph(rows, policy):
    kernel_fill = lambda cache, host: lambda: offload_kernels.fill(cache, host)  # noqa: E731
    replay_lookup_and_fill(rows, kernel_fill, seed=1, steps=100, policy=policy)


def _pooled_executors(
    num_layers: int, num_experts: int, num_slots: int, top_k: int, stream_buffers: int = 2
):
    """Resident executors and, twice, offload executors over one slot pool (as the engine
    builds them, with `stream_buffers` regions): bf16 w13/w2 of hidden 128, intermediate 64."""
    sets = []
    for i in range(num_layers):
        s = expert_set(num_experts, seed=10 + i, hidden=128, inter=64)
        sets.append({k: s[k] for k in ("w13", "w2")})
    resident = [ResidentExecutor({k: v.to(DEV) for k, v in s.items()}) for s in sets]
    built = []
    for _ in range(2):
        store = HostExpertStore(DEV)
        hosts = [store.add_layer({k: v.clone() for k, v in s.items()}) for s in sets]
        counters = torch.zeros(num_layers, NUM_COUNTERS, dtype=torch.int64, device=DEV)
        caches, _ = build_slot_caches(
            hosts, [num_slots] * num_layers, DEV, counters, 4096, stream_buffers=stream_buffers
        )
        executors = [OffloadExecutor(c, h, top_k, store=store) for c, h in zip(caches, hosts)]
        built.append(executors)
    return resident, built


def _routed(g: torch.Generator, rows: int, num_experts: int, top_k: int, hidden: int):
    x = torch.randn(rows, hidden, generator=g).to(torch.bfloat16).to(DEV)
    logits = torch.randn(rows, num_experts, generator=g)
    w, ids = torch.softmax(logits, -1).topk(top_k, -1)
    return x, ids.to(torch.int32).to(DEV), (w / w.sum(-1, keepdim=True)).to(DEV)


@pytest.mark.parametrize("rows", [2, 16])  # 8 and 64 routed ids against 8 slots
def test_pooled_layers_graph_equals_eager_equals_resident_bf16(rows):
    num_layers, num_experts, num_slots, top_k, hidden = 3, 32, 8, 4, 128
    resident, (eager, graphed) = _pooled_executors(num_layers, num_experts, num_slots, top_k)
    static_x = torch.zeros(rows, hidden, dtype=torch.bfloat16, device=DEV)
    static_ids = torch.zeros(num_layers, rows, top_k, dtype=torch.int32, device=DEV)
    static_w = torch.zeros(num_layers, rows, top_k, dtype=torch.float32, device=DEV)
    for layer in range(num_layers):  # compile outside capture
        eager[layer](static_x, static_ids[layer], static_w[layer])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = [graphed[i](static_x, static_ids[i], static_w[i]) for i in range(num_layers)]
    g = torch.Generator().manual_seed(0)
    for step in range(40):
        x = torch.randn(rows, hidden, generator=g).to(torch.bfloat16).to(DEV)
        routed = [_routed(g, rows, num_experts, top_k, hidden)[1:] for _ in range(num_layers)]
        static_x.copy_(x)
        for i, (ids, w) in enumerate(routed):
            static_ids[i].copy_(ids), static_w[i].copy_(w)
        graph.replay()
        for i, (ids, w) in enumerate(routed):
            want = resident[i](x, ids, w).view(torch.int16)
            assert torch.equal(eager[i](x, ids, w).view(torch.int16), want), (step, i)
            assert torch.equal(static_out[i].view(torch.int16), want), (step, i)
    counters = graphed[0].cache.counters
    assert int(counters[MISSES]) > 0  # misses happened inside the graph
    assert (int(counters[OVERFLOW]) > 0) == (rows * top_k > num_slots)


class _Layer(torch.nn.Module):
    """A decoder layer stand-in holding one MoE executor (what the streamer looks for)."""

    def __init__(self, executor) -> None:
        super().__init__()
        self.executor = executor


@pytest.mark.parametrize("buffers", [2, 1])
def test_prompt_pass_streaming_equals_resident(buffers):
    """Three pooled layers run layer by layer over four chunks with the layer streamer
    (copy engine on a side stream, two regions or one: each copy then waits for the previous
    layer's reads, an event on the side stream; slots used in place) == resident bits; each
    layer streamed once; the LRU tables are untouched."""
    num_layers, num_experts, num_slots, top_k, hidden = 3, 32, 8, 4, 128
    resident, (offload, _) = _pooled_executors(num_layers, num_experts, num_slots, top_k, buffers)
    g = torch.Generator().manual_seed(2)
    for layer in range(num_layers):  # some experts in slots, to be used in place
        offload[layer](*_routed(g, 2, num_experts, top_k, hidden))
    tables = [x.cache.state() for x in offload]
    streamer = LayerStreamer(DEV)
    chunks = [_routed(g, 96, num_experts, top_k, hidden) for _ in range(4)]
    streamer.begin([_Layer(x) for x in offload])
    outs = []
    for layer in range(num_layers):
        streamer.enter(layer)
        outs.append([offload[layer](*c) for c in chunks])
        streamer.exit(layer)
    streamer.end()
    for layer in range(num_layers):
        for c, got in zip(chunks, outs[layer]):
            want = resident[layer](*c)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), layer
        cache = offload[layer].cache
        assert int(cache.counters[STAGING_COPIES]) == 1
        assert all(torch.equal(cache.state()[k], v) for k, v in tables[layer].items())


def test_engine_offload_greedy_matches_bf16(tmp_path):
    """Greedy bf16 output through xinfer.LLM: no offload == offload eager == offload with
    CUDA graphs, for a batch whose B·k exceeds the slots (graphs at every batch size) and a
    prompt longer than the step budget (a prompt pass)."""
    from tiny_models import make_hf_model, prompts, write_checkpoint

    from xinfer import LLM, SamplingParams

    path = write_checkpoint(make_hf_model("qwen3_moe"), tmp_path / "ckpt")  # 8 experts, top-2
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    kw = dict(device="cuda:0", dtype="bfloat16", num_kv_blocks=64, max_num_batched_tokens=16)
    long_prompt = prompts(4, seed=5)[3]  # 30 tokens

    def run(**extra):
        llm = LLM(str(path), **kw, **extra)
        out = [r.token_ids for r in llm.generate(prompts(3) + [long_prompt], params)]
        out += [llm.generate(p, params)[0].token_ids for p in prompts(2) + [long_prompt]]
        return out, llm

    base, _ = run(enforce_eager=True)
    for frac in (0.25, 0.5):  # 2 and 4 slots: a batch of 4 routes 8 ids a layer
        eager, llm = run(enforce_eager=True, moe_offload=frac)
        stats = llm.offload_stats()
        assert eager == base and stats["misses"] > 0 and stats["staging_copies"] > 0
        graphed, llm = run(enforce_eager=False, moe_offload=frac)
        assert graphed == base
        assert run(enforce_eager=False, moe_offload=frac, moe_offload_policy="lfu")[0] == base
        graphs = llm.engine.runner.graph_runner.graphs
        assert max(graphs) * 2 > min(llm.offload_stats()["slots_per_layer"])


def _packed_set(num_experts: int, seed: int) -> dict:
    """A layer whose bf16 tensors pack (offload/packed.py; zeros and inf among them:
    escapes) beside a tensor that stays plain: the fill takes the unpack launch and the
    plain one."""
    tensors = expert_set(num_experts, seed, hidden=128, inter=64)
    for name in ("w13", "w2"):
        tensors[name] = tensors[name] * 0.02
        flat = tensors[name].view(num_experts, -1)
        flat[:, ::997] = 0.0
        flat[1::3, 5] = float("inf")
    tensors = pack_layer({k: v for k, v in tensors.items() if k in ("w13", "w2", "u8")})
    assert isinstance(tensors["w13"], PackedExperts) and tensors["u8"].dtype == torch.uint8
    return tensors


@pytest.mark.parametrize("num_experts,num_slots,top_k", [(64, 16, 8), (60, 9, 4)])
def test_packed_fill_from_pinned_memory_equals_twin(num_experts, num_slots, top_k):
    """`--moe-offload-compress`: the unpack kernel reading pinned, mapped planes writes the
    twin's bits, calls wider than the slots included."""
    store = HostExpertStore(DEV)
    host = store.add_layer(_packed_set(num_experts, seed=num_experts))
    assert all(p.is_pinned() for p in host["w13"].planes.values())
    gpu = SlotCache(host, num_slots, DEV)
    cpu = SlotCache(host, num_slots, CPU)
    stream = routing_stream(random.Random(num_slots), num_experts, num_slots, top_k, 80)
    run_against_twins(gpu, cpu, host, stream)
    store.close()


def test_packed_fill_replays_in_cuda_graph():
    """The unpack launch captured with the lookup: replays equal the twins."""
    store = HostExpertStore(DEV)
    host = store.add_layer(_packed_set(64, seed=3))
    gpu, cpu = SlotCache(host, 16, DEV), SlotCache(host, 16, CPU)
    static_ids = torch.zeros(4, 8, dtype=torch.int32, device=DEV)
    warm = SlotCache(host, 16, DEV)
    offload_kernels.lookup(warm, static_ids)
    offload_kernels.fill(warm, host)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_rows = offload_kernels.lookup(gpu, static_ids)
        offload_kernels.fill(gpu, host)
    rng = random.Random(7)
    for step in range(40):
        ids = torch.tensor([rng.sample(range(64), 8) for _ in range(4)], dtype=torch.int32)
        static_ids.copy_(ids)
        graph.replay()
        want = lookup_reference(cpu, ids)
        fill_reference(cpu, host)
        torch.cuda.synchronize()
        assert torch.equal(static_rows.cpu(), want), step
        assert_same(gpu, cpu, host, want, ids, f"replay {step}")
    store.close()


def test_packed_staging_through_the_device_buffer_equals_the_experts():
    """The prompt pass's staging of packed experts: planes copied from pinned memory into the
    device buffer a chunk at a time on a side stream, unpacked from VRAM into scattered rows,
    bit for bit the unpacked experts (two tensors of different escape capacities, one
    buffer)."""
    from xinfer.offload.packed_staging import PackedStager

    store = HostExpertStore(DEV)
    host = store.add_layer(_packed_set(40, seed=5))
    packed = {n: t for n, t in host.items() if isinstance(t, PackedExperts)}
    stager = PackedStager(list(packed.values()), DEV, chunk=6)
    side = torch.cuda.Stream(DEV)
    rng = random.Random(11)
    for name, p in packed.items():
        experts = rng.sample(range(40), 23)
        experts[3:9] = sorted(experts[3:9])
        rows = rng.sample(range(30), 23)
        dst = torch.zeros((30, *p.row_shape), dtype=torch.bfloat16, device=DEV)
        side.wait_stream(torch.cuda.current_stream(DEV))
        with torch.cuda.stream(side):
            stager.stage(p, dst, list(zip(experts, rows)))
        torch.cuda.current_stream(DEV).wait_stream(side)
        got = dst.cpu()
        for e, r in zip(experts, rows):
            want = p.unpack_row(e)
            assert torch.equal(got[r].view(torch.int16), want.view(torch.int16)), (name, e)
    store.close()


def test_packing_on_the_gpu_with_pinned_copies_keeps_the_bits():
    """Start-up packing as the engine runs it on CUDA: the unpacked tensors pinned while they
    are read (unpinned after), the planes pinned by the store when allocated and kept as
    they are by `add_layer`; the packing equals the host's bit for bit."""
    from xinfer.host_memory import host_empty

    store = HostExpertStore(DEV)
    src = host_empty((24, 768, 2048), torch.bfloat16)  # 75 MB: a mapping of its own
    src.copy_((torch.randn(src.shape) * 0.02).to(torch.bfloat16))
    src.view(24, -1)[:, ::997] = 0.0
    want = pack_layer({"w13": src})["w13"]
    with store.pinned_for_copies([src]):
        assert src.is_pinned()
        packed = pack_layer({"w13": src}, DEV, store)["w13"]
    assert not src.is_pinned()
    kept = store.add_layer({"w13": packed})["w13"]
    for name, plane in kept.planes.items():
        assert plane.is_pinned(), name
        assert torch.equal(plane, want.planes[name]), name
    assert kept.low.data_ptr() == packed.low.data_ptr()  # pinned once, not copied
    store.close()


def test_engine_compressed_offload_greedy_matches_bf16(tmp_path):
    """Greedy bf16 output with packed experts, in CUDA graphs and with a prompt pass (the
    staging path unpacks on the side stream): the tokens of no offload; fewer bytes moved."""
    from tiny_models import make_hf_model, prompts, write_checkpoint

    from xinfer import LLM, SamplingParams

    path = write_checkpoint(make_hf_model("qwen3_moe"), tmp_path / "ckpt")
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    kw = dict(device="cuda:0", dtype="bfloat16", num_kv_blocks=64, max_num_batched_tokens=16)
    all_prompts = prompts(3) + [prompts(4, seed=5)[3]]  # the last: a prompt pass

    def run(**extra):
        llm = LLM(str(path), **kw, **extra)
        return [r.token_ids for r in llm.generate(all_prompts, params)], llm.offload_stats()

    base, _ = run(enforce_eager=True)
    for frac in (0.25, 0.5):
        # prefetch off in both, so that their bytes compare one to one; then packed with
        # prefetch at its packed default fill programs, one layer ahead: the model's two MoE
        # layers leave the default two-ahead nothing to predict (it then copies nothing)
        plain, plain_stats = run(moe_offload=frac, moe_prefetch=0)
        packed, stats = run(moe_offload=frac, moe_offload_compress=True, moe_prefetch=0)
        prefetched, pf_stats = run(moe_offload=frac, moe_offload_compress=True, moe_prefetch=1)
        assert packed == plain == base == prefetched, frac
        assert pf_stats["prefetch"]["prefetched"] > 0
        assert stats["compressed"] and stats["staging_copies"] > 0
        assert stats["bytes_moved"] < 0.8 * plain_stats["bytes_moved"]
        assert stats["pinned_gb"] < 0.8 * plain_stats["pinned_gb"]
