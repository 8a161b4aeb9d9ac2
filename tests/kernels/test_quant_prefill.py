"""GPU checks of the quantized prefill path (`kernels/quant_prefill.py`, run on the H200 test
machine) at the Qwen3-30B-A3B shapes: bf16 dequantization has the twin's bits (rounded to
nearest, which the interpreter cannot check), linears and routed experts equal the bf16
kernels on the twin-dequantized weights bit for bit, chunked or not, on a larger slot view or
not, and the chunked expert path of a batch-32 decode (256 pairs: past the GEMV) replays
inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch
from quant_weights import random_weights

from xinfer.kernels import moe_launch, quant_prefill, reference
from xinfer.kernels import quant_launch as ql
from xinfer.quant.awq import AwqInt4
from xinfer.quant.compressed_tensors import PackQuantizedInt4
from xinfer.quant.fp8 import Fp8Block, Fp8Scaled
from xinfer.quant.gptq import GptqInt4
from xinfer.quant.nvfp4 import Nvfp4

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda", 0) if torch.cuda.is_available() else None
BF16 = torch.bfloat16
FORMATS = {
    "fp8": Fp8Block(128, 128),
    "fp8-per-channel": Fp8Scaled(),
    "gptq": GptqInt4(group_size=128, has_zero=False),
    "awq": AwqInt4(group_size=128, has_zero=True),
    "ct-g32": PackQuantizedInt4(32, False, torch.bfloat16),
    "nvfp4": Nvfp4(),
}
HIDDEN, INTER, NUM_EXPERTS, TOP_K = 2048, 768, 16, 8


def _weights(fmt, n, k, seed, count=None):
    return random_weights(fmt, n, k, seed, count, DEV)


def _twin_set(fmt, tensors, n, k):
    count = next(iter(tensors.values())).shape[0]
    experts = [fmt.dequantize({m: t[e] for m, t in tensors.items()}, n, k) for e in range(count)]
    return torch.stack(experts).to(BF16)


@pytest.mark.parametrize("name", list(FORMATS))
def test_bf16_dequantize_has_the_twin_bits(name):
    fmt, n, k = FORMATS[name], 5120, 2048
    tensors = _weights(fmt, n, k, seed=1)
    w = quant_prefill.dequantize_weight(fmt.kernel_weights(tensors, k), n, k, BF16)
    assert torch.equal(w, fmt.dequantize(tensors, n, k).to(BF16))


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("m", [17, 300, 2048])
def test_linear_equals_the_bf16_linear_on_the_twin_weight(name, m):
    fmt, n, k = FORMATS[name], 5120, 2048
    tensors = _weights(fmt, n, k, seed=2)
    x = torch.randn(m, k, device=DEV, dtype=BF16)
    out = ql.linear(x, fmt, tensors, None, n, k)
    assert torch.equal(out, fmt.reference_linear(x, tensors, None, n, k))


def _moe_inputs(name, tokens, seed=3):
    fmt = FORMATS[name]
    w13 = _weights(fmt, 2 * INTER, HIDDEN, seed=seed, count=NUM_EXPERTS)
    w2 = _weights(fmt, HIDDEN, INTER, seed=seed + 1, count=NUM_EXPERTS)
    hidden = torch.randn(tokens, HIDDEN, device=DEV, dtype=BF16)
    weights, ids = reference.route_topk(torch.randn(tokens, NUM_EXPERTS, device=DEV), TOP_K, True)
    return fmt, hidden, ids, weights, w13, w2


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("tokens", [32, 2048])
def test_fused_moe_equals_the_bf16_grouped_path_on_twin_weights(name, tokens):
    fmt, hidden, ids, weights, w13, w2 = _moe_inputs(name, tokens)
    d13, d2 = _twin_set(fmt, w13, 2 * INTER, HIDDEN), _twin_set(fmt, w2, HIDDEN, INTER)
    ref = moe_launch.fused_moe(hidden, ids, weights, d13, d2, use_gemv=False)
    # (T = 32 is below PREFILL_MIN_PAIRS: the dispatcher's dequantized path is asked for)
    whole = ql.fused_moe(hidden, ids, weights, fmt, w13, w2, INTER, use_gemv=False, dequant=True)
    assert torch.equal(whole, ref)
    kw13, kw2 = fmt.kernel_weights(w13, HIDDEN), fmt.kernel_weights(w2, INTER)
    for chunk in (1, 5):
        out = quant_prefill.fused_moe(hidden, ids, weights, kw13, kw2, INTER, chunk=chunk)
        assert torch.equal(out, ref), chunk


def _raw(t):
    """One-byte float tensors as uint8 (indexing them need not be implemented for fp8)."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


@pytest.mark.parametrize("name", list(FORMATS))
def test_fused_moe_on_a_slot_view_equals_the_resident_call(name):
    """The experts at scattered rows of a larger view (an offload slot view: later layers'
    slots and the shared regions), the other rows garbage: the call's bits do not depend on
    the view, its chunking or `max_ids` (the rounds then cover the ids used, not the rows)."""
    fmt, hidden, ids, weights, w13, w2 = _moe_inputs(name, 2048, seed=9)
    kw13, kw2 = fmt.kernel_weights(w13, HIDDEN), fmt.kernel_weights(w2, INTER)
    resident = quant_prefill.fused_moe(hidden, ids, weights, kw13, kw2, INTER)
    num_rows = 96
    rows = torch.randperm(num_rows, device=DEV)[:NUM_EXPERTS]

    def to_view(t):
        raw = _raw(t)
        v = raw[torch.randint(0, NUM_EXPERTS, (num_rows,), device=DEV)].clone()
        v[rows] = raw
        return v.view(t.dtype)

    v13 = fmt.kernel_weights({n: to_view(t) for n, t in w13.items()}, HIDDEN)
    v2 = fmt.kernel_weights({n: to_view(t) for n, t in w2.items()}, INTER)
    view_ids = rows[ids.long()].to(torch.int32)
    for chunk, max_ids in ((None, NUM_EXPERTS), (None, None), (5, NUM_EXPERTS), (7, None)):
        out = quant_prefill.fused_moe(hidden, view_ids, weights, v13, v2, INTER, None, chunk,
                                      max_ids)  # fmt: skip
        assert torch.equal(out, resident), (chunk, max_ids)


@pytest.mark.parametrize("name", list(FORMATS))
def test_chunked_grouped_path_replays_in_cuda_graphs(name):
    fmt, hidden, ids, weights, w13, w2 = _moe_inputs(name, 32, seed=5)  # 256 pairs
    kw13, kw2 = fmt.kernel_weights(w13, HIDDEN), fmt.kernel_weights(w2, INTER)
    lin = _weights(fmt, 5120, HIDDEN, seed=7)
    # the same experts at rows 40.. of a 56-row view: the ids are numbered on the device
    pad = torch.zeros(40, dtype=torch.long, device=DEV)
    view = lambda t: torch.cat([_raw(t)[pad], _raw(t)]).view(t.dtype)  # noqa: E731
    v13 = fmt.kernel_weights({n: view(t) for n, t in w13.items()}, HIDDEN)
    v2 = fmt.kernel_weights({n: view(t) for n, t in w2.items()}, INTER)

    def step():
        view_ids = ids + 40
        return (
            quant_prefill.fused_moe(hidden, ids, weights, kw13, kw2, INTER, chunk=5),
            ql.fused_moe(hidden, ids, weights, fmt, w13, w2, INTER, use_gemv=False, dequant=True),
            ql.linear(hidden, fmt, lin, None, 5120, HIDDEN),  # 32 rows: dequant + cuBLAS
            quant_prefill.fused_moe(
                hidden, view_ids, weights, v13, v2, INTER, chunk=5, max_ids=NUM_EXPERTS
            ),
        )

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    hidden.copy_(torch.randn_like(hidden))
    new_w, new_ids = reference.route_topk(torch.randn(32, NUM_EXPERTS, device=DEV), TOP_K, True)
    weights.copy_(new_w)
    ids.copy_(new_ids)
    graph.replay()
    eager = step()
    assert all(torch.equal(s, e) for s, e in zip(static, eager, strict=True))
    assert torch.equal(static[0], static[1])  # chunked or whole, the same bits
    assert torch.equal(static[0], static[3])  # on a view or not


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("chunk_tokens, count", [(256, 3), (2048, 2)])
def test_joined_call_gives_each_row_its_bits(name, chunk_tokens, count):
    """The formats' merge key (`quant_launch.moe_merge_key`) promises that calls with one key
    give a token the same bits whatever the other tokens: one call over `count` chunks (a
    prompt pass joining them, runner/expert_merge.py) == the chunks' own calls, bit for bit."""
    fmt, hidden, ids, weights, w13, w2 = _moe_inputs(name, chunk_tokens * count, seed=11)
    key = fmt.moe_merge_key(chunk_tokens * TOP_K, hidden)
    assert key is not None and key == fmt.moe_merge_key(count * chunk_tokens * TOP_K, hidden)
    own = [
        fmt.triton_moe(hidden[s], ids[s], weights[s], w13, w2, INTER)
        for s in (slice(c * chunk_tokens, (c + 1) * chunk_tokens) for c in range(count))
    ]
    joined = fmt.triton_moe(hidden, ids, weights, w13, w2, INTER)
    assert torch.equal(joined.view(torch.int16), torch.cat(own).view(torch.int16))
