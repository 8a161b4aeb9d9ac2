"""GPU checks of the quantized-format kernels (run on the H200 test machine): each equals
its twin on random inputs at the Qwen3-30B-A3B shapes (and off-tile ones), a linear row's
bits do not depend on the batch (M <= 16), an expert's bits do not depend on its slot, and
both replay inside CUDA graphs."""

from __future__ import annotations

import pytest
import torch
from quant_weights import random_weights

from xinfer.kernels import quant_launch as ql
from xinfer.kernels import reference
from xinfer.quant.awq import AwqInt4
from xinfer.quant.compressed_tensors import PackQuantizedInt4
from xinfer.quant.fp8 import Fp8Block, Fp8Scaled
from xinfer.quant.gptq import GptqInt4
from xinfer.quant.nvfp4 import Nvfp4

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
FORMATS = {
    "fp8": Fp8Block(128, 128),
    "fp8-channel": Fp8Scaled(),
    "gptq": GptqInt4(group_size=128, has_zero=False),
    "awq": AwqInt4(group_size=128, has_zero=True),
    "ct-g32": PackQuantizedInt4(32, False, torch.bfloat16),
    "nvfp4": Nvfp4(),
    # act-order: x gathered into each weight's perm order first (random per weight and expert)
    "gptq-actorder": GptqInt4(group_size=128, has_zero=True, act_order=True),
    "gptq-actorder-sym": GptqInt4(group_size=128, has_zero=False, act_order=True),
}


def _weights(fmt, n, k, seed, count=None):
    return random_weights(fmt, n, k, seed, count, DEV)


def _down(fmt, n, k, seed, count):
    """An expert set's w2 as the kernels take it: act-order folds its perm into w13's rows."""
    return {m: t for m, t in _weights(fmt, n, k, seed, count).items() if m != "perm"}


def _close(out, ref, what):
    rel = (out.float() - ref.float()).norm() / ref.float().norm()
    assert rel < 1e-2, f"{what}: relative error {rel:.2e}"


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("n,k", [(5120, 2048), (2048, 4096), (136, 384)])
@pytest.mark.parametrize("m", [1, 8, 16, 300])
def test_linear_matches_twin(name, n, k, m):
    fmt = FORMATS[name]
    tensors = _weights(fmt, n, k, seed=n + k)
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    _close(ql.linear(x, fmt, tensors, None, n, k), fmt.reference_linear(x, tensors, None, n, k),
           f"{name} {m}x{n}x{k}")  # fmt: skip


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("n,k", [(5120, 2048), (2048, 4096)])  # qkv (K whole), o_proj (split)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_rows_do_not_depend_on_the_batch(name, n, k, with_bias):
    """Every row of 16 alone (the one-row kernel where the format's `decode_one_row_alone`
    asks for it, else the four-row kernel) and every batch of the first m rows (the four-row
    kernel) on the format's default decode tiles: the bits of the 16-row call, and the same
    call twice the same bits; with a bias too (added in float32 before the cast)."""
    fmt = FORMATS[name]
    tensors = _weights(fmt, n, k, seed=1)
    x = torch.randn(16, k, device=DEV, dtype=torch.bfloat16)
    bias = torch.randn(n, device=DEV, dtype=torch.bfloat16) if with_bias else None
    full = ql.linear(x, fmt, tensors, bias, n, k)
    assert torch.equal(ql.linear(x, fmt, tensors, bias, n, k), full), (name, "twice")
    alone = [j for j in range(16) if not torch.equal(
        ql.linear(x[j : j + 1], fmt, tensors, bias, n, k), full[j : j + 1])]  # fmt: skip
    assert not alone, f"{name} {n}x{k}: rows {alone} alone differ from the batch"
    batches = [m for m in range(2, 16) if not torch.equal(
        ql.linear(x[:m], fmt, tensors, bias, n, k), full[:m])]  # fmt: skip
    assert not batches, f"{name} {n}x{k}: batches of {batches} rows differ from 16"


@pytest.mark.parametrize("name", [n for n in FORMATS if not FORMATS[n].decode_one_row_alone])
@pytest.mark.parametrize("n,k", [(5120, 2048), (2048, 4096)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_one_row_pruned_build_matches_the_batch(name, n, k, with_bias, monkeypatch):
    """`quant_launch.ONE_ROW_PRUNED`'s question: one row on the four-row kernel built with
    rows 1-3 compiled out gets the bits of the default four-row build's 16-row call. With a
    bias too (Qwen1.5/Qwen2 qkv): the bias added before the cast to bf16 shows float32 sums'
    last bits that the cast alone hides (the Q4_K pruned build differed there, 2026-12-07)."""
    fmt = FORMATS[name]
    tensors = _weights(fmt, n, k, seed=1)
    x = torch.randn(16, k, device=DEV, dtype=torch.bfloat16)
    bias = torch.randn(n, device=DEV, dtype=torch.bfloat16) if with_bias else None
    full = ql.linear(x, fmt, tensors, bias, n, k)
    monkeypatch.setattr(ql, "ONE_ROW_PRUNED", True)
    alone = [j for j in range(16) if not torch.equal(
        ql.linear(x[j : j + 1], fmt, tensors, bias, n, k), full[j : j + 1])]  # fmt: skip
    assert not alone, f"{name} {n}x{k}: rows {alone} alone (pruned build) differ from the batch"


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("tokens", [1, 8, 300])
def test_fused_moe_matches_twin_and_ignores_slots(name, tokens):
    fmt, num_experts, top_k, hidden_dim, inter = FORMATS[name], 16, 8, 2048, 768
    w13 = _weights(fmt, 2 * inter, hidden_dim, seed=2, count=num_experts)
    w2 = _down(fmt, hidden_dim, inter, seed=3, count=num_experts)
    hidden = torch.randn(tokens, hidden_dim, device=DEV, dtype=torch.bfloat16)
    logits = torch.randn(tokens, num_experts, device=DEV)
    weights, ids = reference.route_topk(logits, top_k, True)
    out = ql.fused_moe(hidden, ids, weights, fmt, w13, w2, inter)
    _close(out, fmt.reference_moe(hidden, ids, weights, w13, w2, inter), f"{name} T={tokens}")
    perm = torch.randperm(24, device=DEV)[:num_experts]

    def to_slots(t):
        s = torch.zeros((24, *t.shape[1:]), dtype=t.dtype, device=DEV)
        s[perm] = t
        return s

    s13 = {n: to_slots(t) for n, t in w13.items()}
    s2 = {n: to_slots(t) for n, t in w2.items()}
    slot_ids = perm[ids.long()].to(torch.int32)
    assert torch.equal(out, ql.fused_moe(hidden, slot_ids, weights, fmt, s13, s2, inter))


@pytest.mark.parametrize("name", list(FORMATS))
def test_kernels_replay_in_cuda_graphs(name):
    fmt, num_experts, hidden_dim, inter = FORMATS[name], 16, 2048, 768
    w13 = _weights(fmt, 2 * inter, hidden_dim, seed=4, count=num_experts)
    w2 = _down(fmt, hidden_dim, inter, seed=5, count=num_experts)
    lin = _weights(fmt, 5120, hidden_dim, seed=6)
    hidden = torch.randn(8, hidden_dim, device=DEV, dtype=torch.bfloat16)
    weights, ids = reference.route_topk(torch.randn(8, num_experts, device=DEV), 8, True)

    def step():
        return (ql.fused_moe(hidden, ids, weights, fmt, w13, w2, inter),
                ql.linear(hidden, fmt, lin, None, 5120, hidden_dim))  # fmt: skip

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    hidden.copy_(torch.randn_like(hidden))
    new_w, new_ids = reference.route_topk(torch.randn(8, num_experts, device=DEV), 8, True)
    weights.copy_(new_w)
    ids.copy_(new_ids)
    graph.replay()
    eager = step()
    assert torch.equal(static[0], eager[0]) and torch.equal(static[1], eager[1])


@pytest.mark.parametrize("n,k", [(5120, 2048), (2048, 4096)])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_act_order_linear_equals_the_plain_kernel_on_sorted_x(n, k, m):
    """The decode linears gather x through perm and run the plain int4 kernel: the bits of
    that kernel on the sorted codes with x's columns permuted beforehand. (Loading x through
    perm inside the kernel, as before, kept them only to float32 rounding with PDL on.)"""
    fmt = FORMATS["gptq-actorder"]
    plain = GptqInt4(group_size=128, has_zero=True)
    tensors = _weights(fmt, n, k, seed=7)
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    sorted_x = x[:, tensors["perm"].long()].contiguous()
    codes = {name: t for name, t in tensors.items() if name != "perm"}
    out = ql.linear(x, fmt, tensors, None, n, k)
    assert torch.equal(out, ql.linear(sorted_x, plain, codes, None, n, k))
