"""GPU checks of the copy-engine fill (`--moe-offload-fill copy-engine`): inside a replayed
CUDA graph, the lookup followed by the copy-engine fill leaves the same tables, miss lists
and slot rows as the CPU twins, for calls with no miss, an odd number of misses, and more
distinct experts than slots (overflow rows), over tensors of mixed dtypes and odd row sizes;
the engine's greedy output with it equals no offload."""

from __future__ import annotations

import random

import pytest
import torch
from test_offload_gpu import CPU, DEV, assert_same, expert_set

from xinfer.offload import kernels as offload_kernels
from xinfer.offload.copy_engine import BounceBuffers, LayerCopies
from xinfer.offload.graph_nodes import unavailable_reason
from xinfer.offload.host_store import HostExpertStore
from xinfer.offload.lookup import fill_reference, lookup_reference
from xinfer.offload.slot_cache import OVERFLOW, SlotCache

pytestmark = pytest.mark.gpu


def test_copy_engine_is_available_on_the_test_gpu():
    """The H200 machine has a CUDA 13 driver: the copy-engine fill must be usable there (a
    failure here is the reason every other test of this file fails)."""
    assert unavailable_reason() is None


@pytest.mark.parametrize("rows,ways", [(1, 2), (2, 2), (8, 2), (8, 1), (8, 3)])
def test_copy_engine_fill_in_graph_equals_twins(rows, ways):
    num_experts, num_slots, top_k = 64, 16, 8
    store = HostExpertStore(DEV)
    host = store.add_layer(expert_set(num_experts, seed=3))
    gpu, cpu = SlotCache(host, num_slots, DEV), SlotCache(host, num_slots, CPU)
    copies = LayerCopies(gpu, host, BounceBuffers(DEV, ways))
    static_ids = torch.zeros(rows, top_k, dtype=torch.int32, device=DEV)
    warm = SlotCache(host, num_slots, DEV)
    offload_kernels.lookup(warm, static_ids)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_rows = offload_kernels.lookup(gpu, static_ids)
        copies.fill()
    rng = random.Random(rows * 10 + ways)
    misses_seen, ids = set(), None
    for step in range(60):
        if ids is None or step % 10 != 9:  # step 9, 19, ...: the last call again (all hit)
            ids = torch.tensor([rng.sample(range(num_experts), top_k) for _ in range(rows)])
        static_ids.copy_(ids.to(torch.int32))
        graph.replay()
        want = lookup_reference(cpu, ids.to(torch.int32))
        fill_reference(cpu, host)
        torch.cuda.synchronize()
        misses_seen.add(int(cpu.miss_count))
        assert torch.equal(static_rows.cpu(), want), step
        assert_same(gpu, cpu, host, want, ids, f"replay {step}")
    assert 0 in misses_seen and any(n % 2 for n in misses_seen)
    assert (int(gpu.counters[OVERFLOW]) > 0) == (rows * top_k > num_slots)
    store.close()


def test_engine_copy_engine_fill_greedy_matches_no_offload(tmp_path):
    """Greedy bf16 output through xinfer.LLM with CUDA graphs: no offload == offload with
    the fill kernel == offload with the copy-engine fill, batches wider than the slots."""
    from tiny_models import make_hf_model, prompts, write_checkpoint

    from xinfer import LLM, SamplingParams

    path = write_checkpoint(make_hf_model("qwen3_moe"), tmp_path / "ckpt")  # 8 experts, top-2
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    kw = dict(device="cuda:0", dtype="bfloat16", num_kv_blocks=64, max_num_batched_tokens=16)

    def run(**extra):
        llm = LLM(str(path), **kw, **extra)
        out = [r.token_ids for r in llm.generate(prompts(4), params)]
        out += [llm.generate(p, params)[0].token_ids for p in prompts(2)]
        return out, llm

    base, _ = run(enforce_eager=True)
    for frac in (0.25, 0.5):
        kernel, _ = run(moe_offload=frac)
        copied, llm = run(moe_offload=frac, moe_offload_fill="copy-engine")
        assert kernel == base and copied == base
        assert llm.offload_stats()["misses"] > 0
        assert llm.engine.runner.graph_runner.graphs  # decode ran in graphs
