"""Sampling reads nothing back from the device before its tokens are wanted: the top-k width
comes from the host-side parameters (`SamplingMetadata.max_top_k`), not from `k.max()`.
On CPU every host read of a tensor value (`.item()`, `.tolist()`, `int(t)`, ...) is made
to raise while `sample_async` runs; on CUDA the same runs under `set_sync_debug_mode`."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from xinfer.sampling import SamplingMetadata, SamplingParams, make_generator, sample_async

_HOST_READS = ("item", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__")


def _params() -> list[SamplingParams]:
    """Rows that use top-k (with different k), one with top-k off, top-p, min-p, greedy,
    seeded and unseeded, with and without logprobs."""
    return [
        SamplingParams(temperature=0.8, top_k=5, seed=1),
        SamplingParams(temperature=1.2, top_k=40, top_p=0.9, logprobs=3),
        SamplingParams(temperature=0.7, top_k=0, min_p=0.05, seed=2),
        SamplingParams(temperature=0.0, top_k=7),
        SamplingParams(temperature=1.0, top_k=1),
    ]


def _meta(params, vocab: int, device) -> SamplingMetadata:
    gens = [make_generator(p.seed, device) if p.seed is not None else None for p in params]
    return SamplingMetadata.for_params(params, gens, vocab, device)


def test_top_k_width_comes_from_the_host(monkeypatch):
    vocab = 97
    params = _params()
    logits = torch.randn(len(params), vocab, generator=torch.Generator().manual_seed(0))
    meta = _meta(params, vocab, "cpu")
    assert meta.max_top_k == vocab  # the row with top-k off needs the full width

    def refuse(self, *args, **kwargs):
        raise AssertionError("sampling read a tensor value back to the host")

    torch.manual_seed(7)  # the unseeded row draws from the default generator: same draws
    with monkeypatch.context() as m:
        for name in _HOST_READS:
            m.setattr(torch.Tensor, name, refuse)
        pending = sample_async(logits, meta)
    tokens = pending.result().token_ids

    # The same tokens as a pass whose width is read from the tensor (the old behaviour) —
    # the width only bounds the k-th value and never changes it.
    again = _meta(params, vocab, "cpu")
    wide = dataclasses.replace(again, max_top_k=int(again.top_k.max()))
    torch.manual_seed(7)
    assert sample_async(logits, wide).result().token_ids == tokens
    for row, p in enumerate(params):
        if p.temperature == 0:
            assert tokens[row] == int(logits[row].argmax())
        elif p.top_k > 0:
            assert tokens[row] in logits[row].topk(p.top_k).indices.tolist()


def test_narrow_top_k_batch_uses_its_largest_k():
    params = [SamplingParams(temperature=1.0, top_k=k, seed=k) for k in (3, 9)]
    meta = _meta(params, 50, "cpu")
    assert meta.max_top_k == 9


@pytest.mark.gpu
def test_sampling_does_not_synchronize_on_cuda():
    device = torch.device("cuda")
    vocab = 151_936
    params = _params()
    logits = torch.randn(len(params), vocab, device=device)
    meta = _meta(params, vocab, device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pending = sample_async(logits, meta)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    tokens = pending.result().token_ids
    assert len(tokens) == len(params) and all(0 <= t < vocab for t in tokens)
