"""When every expert fits (fraction 1.0, or `auto` with room), each MoE layer runs the
resident executor: no host store, no slots, no lookup or fill; the stats say so (every layer
resident, nothing moved) and greedy output equals the engine without offload."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams
from xinfer.offload.executor import OffloadExecutor, ResidentExecutor

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_checkpoint(make_hf_model("qwen3_moe"), tmp_path_factory.mktemp("qwen3")))


def _assert_all_resident(llm: LLM) -> None:
    manager = llm.engine.offload_manager
    layers = llm.engine.model.moe_layers()
    assert manager.executors == [] and manager.num_resident_layers == len(layers) == 2
    assert manager.store.nbytes == 0  # no host copy of any expert
    assert all(type(layer.executor) is ResidentExecutor for layer in layers)
    assert all(layer.executor.tensors["w13"].shape[0] == 8 for layer in layers)
    assert manager.is_graph_safe(1) and manager.is_graph_safe(64)  # no slot limit
    st = llm.offload_stats()
    assert (st["resident_layers"], st["offloaded_layers"]) == (2, 0)
    assert st["slots_per_layer"] == [8, 8] and st["slot_gb"] == 0 and st["resident_gb"] > 0
    assert all(layer["resident"] for layer in st["layers"])
    assert (st["calls"], st["hits"], st["misses"], st["bytes_moved"]) == (0, 0, 0, 0)
    assert st["pinned_gb"] == 0 and st["staging_gb"] == 0
    assert "run resident" in manager.format_summary(1.0)


@pytest.mark.parametrize("option", [1.0, "auto"])
def test_every_expert_fits_runs_resident(ckpt, option):
    base = [r.token_ids for r in LLM(ckpt, device="cpu").generate(prompts(3), GREEDY)]
    llm = LLM(ckpt, device="cpu", moe_offload=option)
    _assert_all_resident(llm)
    assert [r.token_ids for r in llm.generate(prompts(3), GREEDY)] == base
    _assert_all_resident(llm)  # still nothing moved after generating


def test_below_every_expert_stays_offloaded(ckpt):
    llm = LLM(ckpt, device="cpu", moe_offload=0.5)
    manager = llm.engine.offload_manager
    assert manager.num_resident_layers == 0 and len(manager.executors) == 2
    assert all(type(layer.executor) is OffloadExecutor for layer in llm.engine.model.moe_layers())
    llm.generate(prompts(1), GREEDY)
    st = llm.offload_stats()
    assert (st["resident_layers"], st["offloaded_layers"]) == (0, 2)
    assert st["calls"] > 0 and st["resident_gb"] == 0
    assert "hit rate" in manager.format_summary()


@pytest.mark.gpu
def test_fraction_one_builds_experts_on_the_gpu(ckpt):
    """Known before loading: the experts are created on the GPU, never pinned on the host."""
    llm = LLM(ckpt, device="cuda:0", moe_offload=1.0, enforce_eager=True)
    _assert_all_resident(llm)
    for layer in llm.engine.model.moe_layers():
        assert layer.executor.tensors["w13"].is_cuda and layer.executor.tensors["w2"].is_cuda
    base = LLM(ckpt, device="cuda:0", enforce_eager=True)
    want = [r.token_ids for r in base.generate(prompts(2), GREEDY)]
    assert [r.token_ids for r in llm.generate(prompts(2), GREEDY)] == want
    assert torch.cuda.is_available()
