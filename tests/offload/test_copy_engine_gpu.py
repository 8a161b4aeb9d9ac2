"""GPU checks of the copy-engine fill (`--moe-offload-fill copy-engine`): inside a replayed
CUDA graph, the lookup followed by the copy-engine fill leaves the same tables, miss lists
and slot rows as the CPU twins, for calls with no miss, an odd number of misses, and more
distinct experts than slots (overflow rows), over tensors of mixed dtypes and odd row sizes;
the engine's greedy output with it equals no offload."""

from __future__ import annotations

import pytest
from test_offload_gpu import DEV, replay_lookup_and_fill

from xinfer.offload.copy_engine import BounceBuffers, LayerCopies
from xinfer.offload.graph_nodes import unavailable_reason

pytestmark = pytest.mark.gpu


def test_copy_engine_is_available_on_the_test_gpu():
    """The H200 machine has a CUDA 13 driver: the copy-engine fill must be usable there (a
    failure here is the reason every other test of this file fails)."""
    assert unavailable_reason() is None


@pytest.mark.parametrize("rows,ways", [(1, 2), (2, 2), (8, 2), (8, 1), (8, 3)])
def test_copy_engine_fill_in_graph_equals_twins(rows, ways):
    def copy_engine_fill(cache, host):
        return LayerCopies(cache, host, BounceBuffers(DEV, ways)).fill

    misses_seen = replay_lookup_and_fill(rows, copy_engine_fill, seed=3)
    assert any(n % 2 for n in misses_seen)  # an odd count: a pass with one way idle


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
        # demand fills by the kernel, prefetch copies by the copy engine
        mixed, llm = run(moe_offload=frac, moe_prefetch=1, moe_prefetch_fill="copy-engine")
        assert mixed == base
        assert llm.engine.offload_manager.prefetcher.copies is not None
