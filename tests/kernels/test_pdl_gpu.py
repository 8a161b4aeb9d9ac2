"""Programmatic dependent launch (`xinfer.kernels.pdl`) on the GPU: a kernel launched with
it may start before the kernel ahead of it has finished, and waits on the device for it
(`triton/pdl.py`). What can go wrong shows as a value read before it was written, now and
then. So: a decode layer's chain of kernels (norm, router GEMV, top-k, MoE GEMVs with the
combine in the last program, attention with its merge, the split-K GEMV) run many times in
a row and replayed from a CUDA graph with PDL on, bit-equal to PDL off; and engine greedy
output with and without it. All `gpu`: skipped without CUDA (and without sm_90, where PDL
is not offered)."""

from __future__ import annotations

import functools

import pytest
import torch
from cuda_graphs import capture_after_warmup

pytestmark = pytest.mark.gpu


@pytest.fixture
def pdl_switch(monkeypatch):
    pytest.importorskip("triton")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs an sm_90+ GPU")
    monkeypatch.delenv("XINFER_DISABLE_TRITON", raising=False)
    from xinfer.kernels import pdl

    def run(call, on: bool):
        with monkeypatch.context() as patch:
            patch.setattr(pdl, "ENABLED", on)
            # an engine's start sets the flag from the environment: the same value there
            patch.setenv("XINFER_PDL", "1" if on else "0")
            return call()

    return run


def _layer_chain(seed: int = 0):
    """One decode layer of the Qwen3-30B-A3B shape at batch 1, as a call that returns every
    intermediate output."""
    from xinfer import kernels

    g = torch.Generator("cuda").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)

    x, res = randn(1, 2048), randn(1, 2048)
    norm_w = randn(2048, scale=0.1) + 1
    router = randn(128, 2048, scale=0.02)
    w13, w2 = randn(128, 1536, 2048, scale=0.02), randn(128, 2048, 768, scale=0.02)
    o_proj = randn(2048, 4096, scale=0.02)
    bound, block = 4096, 16
    k_cache = randn(bound // block + 2, block, 4, 128)
    v_cache = randn(bound // block + 2, block, 4, 128)
    tables = torch.randperm(bound // block + 2, generator=g, device="cuda")[: bound // block]
    tables = tables.view(1, -1).to(torch.int32)
    seq_lens = torch.tensor([1000], dtype=torch.int32, device="cuda")
    qsl = torch.arange(2, dtype=torch.int32, device="cuda")
    q = randn(1, 32, 128)

    def call():
        h, r = kernels.rms_norm(x, norm_w, 1e-6, res)
        logits = kernels.linear(h, router)
        weights, ids = kernels.route_topk(logits, 8, True)
        moe = kernels.fused_moe(h, ids, weights, w13, w2)
        attn = kernels.paged_attention(
            q, k_cache, v_cache, tables, seq_lens, qsl, 0.088, max_query_len=1,
            max_seq_len=bound,
        )  # fmt: skip
        out = kernels.linear(attn.reshape(1, 4096), o_proj)
        h2, r2 = kernels.rms_norm(out, norm_w, 1e-6, r)
        return [h, r, logits, weights, ids, moe, attn, out, h2, r2]

    return call


def _assert_same(got, want, where: str) -> None:
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"{where}: output {i} differs ({(a != b).sum().item()} values)"


def test_decode_chain_with_pdl_has_the_same_bits(pdl_switch) -> None:
    call = _layer_chain()
    want = [t.clone() for t in pdl_switch(call, on=False)]
    runs = [pdl_switch(call, on=True) for _ in range(50)]
    torch.cuda.synchronize()
    for i, got in enumerate(runs):
        _assert_same(got, want, f"run {i}")


def test_decode_chain_with_pdl_replays_in_a_cuda_graph(pdl_switch) -> None:
    call = _layer_chain(seed=1)
    want = [t.clone() for t in pdl_switch(call, on=False)]
    graph, outs = pdl_switch(lambda: capture_after_warmup(call), on=True)
    for i in range(20):
        graph.replay()
        torch.cuda.synchronize()
        _assert_same(outs, want, f"replay {i}")


def test_engine_greedy_with_pdl_equals_without(pdl_switch, tmp_path) -> None:
    """The tiny MoE model in CUDA graphs, resident and with offload: the same tokens."""
    from tiny_models import make_hf_model, prompts, write_checkpoint

    from xinfer import LLM, SamplingParams

    path = str(write_checkpoint(make_hf_model("qwen3_moe"), tmp_path / "ckpt"))
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    kw = dict(device="cuda:0", dtype="bfloat16", num_kv_blocks=64)

    def tokens(**extra):
        llm = LLM(path, **kw, **extra)
        return [r.token_ids for r in llm.generate(prompts(3), params)]

    for extra in ({}, {"moe_offload": 0.25}):
        run = functools.partial(tokens, **extra)
        assert pdl_switch(run, on=True) == pdl_switch(run, on=False), extra
