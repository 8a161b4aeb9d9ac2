"""GPU: the compiled routing-model kernels equal their twins, and routing sources run inside
CUDA graphs with decode look-ahead: greedy output with the routing model is the same eager
and graphed, with and without offload; a trace recorded from graphed decode equals one
recorded eagerly, and replaying it reproduces the router's run."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams
from xinfer.routing.config import PRESETS
from xinfer.routing.parametric import popularity_draw
from xinfer.routing.parametric_ops import (
    RoutingState,
    SequenceBatch,
    advance_state,
    advance_state_reference,
    layer_constants,
    select_experts,
    select_experts_reference,
)
from xinfer.routing.trace import read_trace

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def _to(state: RoutingState, device) -> RoutingState:
    return RoutingState(state.c.to(device), state.pos.to(device), state.key.to(device))


@pytest.mark.parametrize(("num_experts", "top_k"), [(128, 8), (256, 8), (60, 4)])
def test_kernels_equal_twins(num_experts, top_k):
    g = torch.Generator().manual_seed(num_experts)
    rows = 40
    state = RoutingState.empty(rows, num_experts, torch.device("cpu"))
    state.c.copy_(torch.randn(rows + 1, num_experts, generator=g))
    state.key[:rows] = torch.randint(0, 50, (rows,), generator=g)
    state.pos[:rows] = torch.randint(0, 30, (rows,), generator=g)
    # 33 sequences: decode steps continuing / repeating / fresh, prompt chunks, padding
    lens = [1] * 24 + [7, 100, 1, 33, 2, 1, 513, 1, 1]
    seq_rows = list(range(33))
    keys = [int(state.key[r]) if r % 3 else 200 + r for r in seq_rows]
    keys[30] = keys[31] = -1  # padding
    seq_rows[30] = seq_rows[31] = rows
    firsts = [int(state.pos[r]) + (r % 2) if r < rows else 0 for r in seq_rows]
    firsts[30] = firsts[31] = -1
    qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    seq_lens = torch.tensor([f + n for f, n in zip(firsts, lens)], dtype=torch.int32)
    batch = SequenceBatch(qsl, seq_lens, torch.tensor(seq_rows), torch.tensor(keys), False)
    p = PRESETS["qwen3-30b-a3b"]
    const = layer_constants(
        3, 7, p.layer_scale(7), p.sigma, p.tau, p.phi, popularity_draw(3, 7, num_experts)
    )
    num_tokens = sum(lens)
    logits = torch.randn(num_tokens, num_experts, generator=g).to(torch.bfloat16)
    ref_state = RoutingState(state.c.clone(), state.pos.clone(), state.key.clone())
    c_ref, k_ref, p_ref = advance_state_reference(ref_state, batch, const, num_tokens)
    w_ref, ids_ref = select_experts_reference(c_ref, k_ref, p_ref, logits, const, top_k, True)

    gpu_state = _to(state, DEV)
    gpu_batch = SequenceBatch(*(t.to(DEV) for t in (qsl, seq_lens, batch.rows, batch.keys)),
                              False)  # fmt: skip
    from dataclasses import replace

    gconst = replace(const, popularity=const.popularity.to(DEV))
    c, k, pos = advance_state(gpu_state, gpu_batch, gconst, num_tokens)
    assert torch.equal(k.cpu(), k_ref) and torch.equal(pos.cpu(), p_ref)
    torch.testing.assert_close(c.cpu(), c_ref, rtol=1e-4, atol=1e-4)
    for name in ("c", "pos", "key"):
        torch.testing.assert_close(
            getattr(gpu_state, name)[:rows].cpu(), getattr(ref_state, name)[:rows],
            rtol=1e-4, atol=1e-4,
        )  # fmt: skip
    # selection on the same c: the ids must agree (c is the twin's, so no near-tie drift)
    w, ids = select_experts(
        c_ref.to(DEV), k_ref.to(DEV), p_ref.to(DEV), logits.to(DEV), gconst, top_k, True
    )
    assert torch.equal(ids.cpu(), ids_ref)
    torch.testing.assert_close(w.cpu(), w_ref, rtol=1e-5, atol=1e-6)
    # and in a CUDA graph, on the same inputs
    graph_state = _to(state, DEV)
    advance_state(graph_state, gpu_batch, gconst, num_tokens)  # compile outside the capture
    graph_state = _to(state, DEV)
    dev_logits = logits.to(DEV)  # a host→GPU copy cannot be captured
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gc, gk, gp = advance_state(graph_state, gpu_batch, gconst, num_tokens)
        gw, gids = select_experts(gc, gk, gp, dev_logits, gconst, top_k, True)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(gc, c)
    assert torch.equal(gk, k) and torch.equal(gp, pos)
    gw_eager, gids_eager = select_experts(gc, gk, gp, dev_logits, gconst, top_k, True)
    assert torch.equal(gids, gids_eager)
    torch.testing.assert_close(gw, gw_eager, rtol=0, atol=0)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    model = make_hf_model("qwen3_moe", seed=3, num_experts=16)
    return str(write_checkpoint(model, tmp_path_factory.mktemp("qwen3_moe")))


def _run(ckpt, **kw):
    llm = LLM(ckpt, device="cuda:0", dtype="bfloat16", num_kv_blocks=64, **kw)
    out = [r.token_ids for r in llm.generate(prompts(3), GREEDY)]
    out += [llm.generate(p, GREEDY)[0].token_ids for p in prompts(2)]
    return llm, out


def test_routing_model_in_graphs_with_look_ahead(ckpt):
    _, eager = _run(ckpt, enforce_eager=True, routing_source="qwen3-30b-a3b")
    _, router = _run(ckpt, enforce_eager=True)
    assert eager != router
    for frac in (None, 0.25, 0.5):
        llm, graphed = _run(ckpt, routing_source="qwen3-30b-a3b", moe_offload=frac)
        assert llm.engine.runner.graph_runner.graphs, "decode graphs were captured"
        assert llm.engine.runner.look_ahead_counts["used"] > 0
        assert graphed == eager, f"graphed routing-model output differs (offload {frac})"


def test_recording_in_graphs_and_replay(ckpt, tmp_path):
    traces = {}
    for name, eager in (("eager", True), ("graphed", False)):
        path = tmp_path / f"{name}.trace"
        llm, out = _run(ckpt, enforce_eager=eager, record_routing=str(path))
        llm.close()
        traces[name] = (out, read_trace(path)[1])
    (out_e, steps_e), (out_g, steps_g) = traces["eager"], traces["graphed"]
    assert out_e == out_g and len(steps_e) == len(steps_g)
    for a, b in zip(steps_e, steps_g):
        assert a.requests == b.requests
        assert (a.ids == b.ids).all()
    _, replayed = _run(ckpt, routing_source=f"replay:{tmp_path / 'graphed.trace'}")
    assert replayed == out_g
