"""Act-order int4 (GPTQ desc_act: `perm`, x gathered through it) in the quantized kernels,
run by Triton's CPU interpreter: every path that takes a perm (decode GEMV one-row and
four-row, in both code reads, the dot-tile linear, the MoE gate/up GEMV and grouped GEMM —
each after `permute_launch`'s gather — and the dequant kernel) equals the format's twin, and
a weight with a perm gives exactly the bits of the plain int4 kernel on its sorted codes
with x's columns permuted beforehand (the gather is the only change; without a perm the
kernels are the plain ones, which test_quant_kernels_interpret.py checks against their
twins).

Runs in a child pytest with TRITON_INTERPRET=1 (see interpreter_child.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted
from quant_weights import random_weights

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)

N, K = 40, 128  # N off the tiles, K four groups of 32 (sizes that are not tile multiples)


def _formats():
    from xinfer.quant.gptq import GptqInt4

    act = GptqInt4(group_size=32, has_zero=True, act_order=True)
    return act, dataclasses.replace(act, act_order=False)


@pytest.fixture(scope="module")
def ql():
    from xinfer.kernels import quant_launch
    from xinfer.kernels.triton import quant_gemm

    require_interpreted(quant_gemm.quant_linear_kernel)
    return quant_launch


def _plain(tensors):
    return {n: t for n, t in tensors.items() if n != "perm"}


@child_only
@pytest.mark.parametrize(
    "m,block_m,read_words,dequant",
    [(1, 4, True, None), (1, 1, True, None), (5, 4, True, None), (3, 1, False, None),
     (21, None, True, False), (21, None, True, True)],
    ids=["one-row-pruned", "one-row-gemv", "four-row", "gemv-bytes", "dot-tile", "prefill"],
)  # fmt: skip
def test_linear_with_perm_matches_twin_and_the_sorted_plain_kernel(
    ql, monkeypatch, m, block_m, read_words, dequant
):
    act, plain = _formats()
    tensors = random_weights(act, N, K, seed=m)
    perm = tensors["perm"].long()
    assert not torch.equal(perm, torch.arange(K))
    g = torch.Generator().manual_seed(100 + m)
    x = torch.randn(m, K, generator=g)
    bias = torch.randn(N, generator=g)
    tiles = None
    if block_m is not None:
        kw = act.kernel_weights(tensors, K)
        tiles = dataclasses.replace(ql.linear_tiles(2, x.dtype, kw, K, act), block_m=block_m)
    if not read_words:  # 4-bit codes a byte at a time: the even/odd x loads through perm
        monkeypatch.setattr(ql, "words", lambda *a: False)
    out = ql.linear(x, act, tensors, bias, N, K, tiles=tiles, dequant=dequant)
    ref = act.reference_linear(x, tensors, bias, N, K)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    sorted_x = x[:, perm].contiguous()
    same = ql.linear(sorted_x, plain, _plain(tensors), bias, N, K, tiles=tiles, dequant=dequant)
    assert torch.equal(out, same)


MOE_PATHS = {  # (use_gemv, dequant, tiles)
    "gemv-joined": (True, None, None),
    "gemv-apart": (True, None, "apart"),
    "grouped-in-registers": (False, False, None),
    "grouped-dequantized": (False, True, None),
}


@child_only
@pytest.mark.parametrize("path", list(MOE_PATHS))
def test_fused_moe_with_perms_matches_twin(ql, path):
    """Each expert its own w13 perm (x gathered per pair); w2's perm is folded (the format
    drops it before the kernels: they run w2 in its sorted order, as the twin does)."""
    from xinfer.kernels import reference

    act, _ = _formats()
    use_gemv, dequant, tiles = MOE_PATHS[path]
    num_experts, top_k, tokens, inter = 5, 2, 3, 64
    w13 = random_weights(act, 2 * inter, K, seed=1, count=num_experts)
    w2 = random_weights(act, K, inter, seed=2, count=num_experts)
    assert not torch.equal(w13["perm"][0], w13["perm"][1])
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(tokens, K, generator=g)
    weights, ids = reference.route_topk(torch.randn(tokens, num_experts, generator=g), top_k, True)
    if tiles == "apart":
        kw13 = act.kernel_weights(w13, K)
        tiles = dataclasses.replace(ql.gemv_tiles(act, kw13), joined=False)
    run = dict(use_gemv=use_gemv, dequant=dequant, tiles=tiles)
    if path == "gemv-joined":  # the format's own call (it drops w2's perm)
        out = act.triton_moe(hidden, ids, weights, w13, w2, inter)
    else:
        out = ql.fused_moe(hidden, ids, weights, act, w13, _plain(w2), inter, **run)
    ref = act.reference_moe(hidden, ids, weights, w13, w2, inter)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="w2 takes no perm"):
        ql.fused_moe(hidden, ids, weights, act, w13, w2, inter, **run)


@child_only
def test_dequant_kernel_writes_input_channel_order(ql):
    """The dequant kernel on an act-order expert set scatters each stored column to its input
    channel: the twin's dequantization, bit for bit."""
    from xinfer.kernels import quant_prefill

    act, _ = _formats()
    count = 3
    tensors = random_weights(act, N, K, seed=5, count=count)
    kw = act.kernel_weights(tensors, K)
    out = torch.full((count, N, K), float("nan"))
    quant_prefill.dequantize(kw, N, K, out)
    for e in range(count):
        assert torch.equal(out[e], act.dequantize({n: t[e] for n, t in tensors.items()}, N, K))
