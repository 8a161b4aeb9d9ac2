"""The prefill path of the quantized formats (`kernels/quant_prefill.py`) run by Triton's CPU
interpreter: the dequant kernel gives the twin's bits, and linears and routed experts give
exactly what the unquantized kernels give on the twin-dequantized weights, however the
experts are chunked and whichever slots hold them. fp16/fp32 only: the interpreter
truncates bf16 casts (the GPU rounds to nearest; tests/kernels/test_quant_prefill.py).

Runs in a child pytest with TRITON_INTERPRET=1 (see interpreter_child.py)."""

from __future__ import annotations

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted
from quant_weights import random_weights

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)

FORMATS = ["fp8-16x32", "fp8-per-channel", "gptq-g32-sym", "awq-g64-asym", "ct-g32-asym", "nvfp4"]
# (N, K): N off every tile, K a multiple of the int4 / nvfp4 groups, off the fp8 blocks
SHAPES = {"fp8-16x32": (37, 80), "nvfp4": (37, 96), "gptq-g32-sym": (40, 96)}
SHAPES |= {"awq-g64-asym": (40, 128), "ct-g32-asym": (37, 128), "fp8-per-channel": (37, 128)}


def _format(name):
    from xinfer.quant.awq import AwqInt4
    from xinfer.quant.compressed_tensors import PackQuantizedInt4
    from xinfer.quant.fp8 import Fp8Block, Fp8Scaled
    from xinfer.quant.gptq import GptqInt4
    from xinfer.quant.nvfp4 import Nvfp4

    return {
        "fp8-16x32": Fp8Block(16, 32),
        "fp8-per-channel": Fp8Scaled(),
        "gptq-g32-sym": GptqInt4(group_size=32, has_zero=False),
        "awq-g64-asym": AwqInt4(group_size=64, has_zero=True),
        "ct-g32-asym": PackQuantizedInt4(32, True, torch.bfloat16),
        "nvfp4": Nvfp4(),
    }[name]


@pytest.fixture(scope="module")
def qp():
    from xinfer.kernels import quant_prefill
    from xinfer.kernels.triton import quant_dequant_kernel

    require_interpreted(quant_dequant_kernel.dequant_kernel)
    return quant_prefill


def _weights(fmt, n, k, seed, count=None):
    return random_weights(fmt, n, k, seed, count)


def _twin_set(fmt, tensors, n, k, dtype):
    """The twin's dequantization of every expert of an `[E, ...]` set, in `dtype`."""
    count = next(iter(tensors.values())).shape[0]
    experts = [fmt.dequantize({m: t[e] for m, t in tensors.items()}, n, k) for e in range(count)]
    return torch.stack(experts).to(dtype)


@child_only
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dequantize_has_the_twin_bits(qp, name, dtype):
    fmt = _format(name)
    n, k = SHAPES[name]
    tensors = _weights(fmt, n, k, seed=1)
    w = qp.dequantize_weight(fmt.kernel_weights(tensors, k), n, k, dtype)
    assert w.dtype == dtype and torch.equal(w, fmt.dequantize(tensors, n, k).to(dtype))

    # experts 2..3 of a set of 5; then gathered: the list's entries 1..3 (experts 3, none, 1),
    # the negative id skipped: its rows keep what they held
    experts = _weights(fmt, n, k, seed=2, count=5)
    twin = _twin_set(fmt, experts, n, k, dtype)
    kw = fmt.kernel_weights(experts, k)
    assert torch.equal(qp.dequantize(kw, n, k, torch.empty(2, n, k, dtype=dtype), 2), twin[2:4])
    out = torch.full((3, n, k), 7.0, dtype=dtype)
    ids = torch.tensor([0, 3, -1, 1], dtype=torch.int32)
    qp.dequantize(kw, n, k, out, first=1, ids=ids)
    assert torch.equal(out[0], twin[3]) and torch.equal(out[2], twin[1])
    assert (out[1] == 7.0).all()


@child_only
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_equals_the_float_linear_on_the_twin_weight(qp, name, dtype):
    from xinfer.kernels import quant_launch, reference

    fmt = _format(name)
    n, k = SHAPES[name]
    tensors = _weights(fmt, n, k, seed=3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 7, k, generator=g).to(dtype)  # 21 rows: asked for the prefill path
    bias = torch.randn(n, generator=g).to(dtype)
    out = quant_launch.linear(x, fmt, tensors, bias, n, k, dequant=True)
    ref = reference.linear(x, fmt.dequantize(tensors, n, k).to(dtype), bias)
    assert out.shape == (3, 7, n) and torch.equal(out, ref)
    assert torch.equal(out, fmt.reference_linear(x, tensors, bias, n, k))
    rows = torch.randn(quant_launch.PREFILL_MIN_ROWS, k, generator=g).to(dtype)  # by default
    want = reference.linear(rows, fmt.dequantize(tensors, n, k).to(dtype), bias)
    assert torch.equal(quant_launch.linear(rows, fmt, tensors, bias, n, k), want)


def _moe_case(name, dtype, num_experts=5, tokens=7, top_k=2):
    from xinfer.kernels import reference

    fmt = _format(name)
    hidden_dim = SHAPES[name][1]
    inter = 64 if name == "awq-g64-asym" else 32
    w13 = _weights(fmt, 2 * inter, hidden_dim, seed=5, count=num_experts)
    w2 = _weights(fmt, hidden_dim, inter, seed=6, count=num_experts)
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(tokens, hidden_dim, generator=g).to(dtype)
    weights, ids = reference.route_topk(torch.randn(tokens, num_experts, generator=g), top_k, True)
    return fmt, hidden, ids, weights, w13, w2, inter


# each format whole and in chunks of one and two experts, both dtypes among them
CHUNKS = [(None, torch.float32), (1, torch.float16), (2, torch.float32)]


@child_only
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("chunk,dtype", CHUNKS, ids=["whole-fp32", "chunk1-fp16", "chunk2-fp32"])
def test_fused_moe_equals_the_float_grouped_path_on_twin_weights(qp, name, dtype, chunk):
    from xinfer.kernels import moe_launch

    fmt, hidden, ids, weights, w13, w2, inter = _moe_case(name, dtype)
    hidden_dim = hidden.shape[1]
    cfg = moe_launch.MoeConfig(block_m=16, block_n=16, block_k=32, num_warps=4)
    kw13, kw2 = fmt.kernel_weights(w13, hidden_dim), fmt.kernel_weights(w2, inter)
    out = qp.fused_moe(hidden, ids, weights, kw13, kw2, inter, config=cfg, chunk=chunk)
    d13 = _twin_set(fmt, w13, 2 * inter, hidden_dim, dtype)
    d2 = _twin_set(fmt, w2, hidden_dim, inter, dtype)
    ref = moe_launch.fused_moe(hidden, ids, weights, d13, d2, config=cfg, use_gemv=False)
    assert out.dtype == dtype and torch.equal(out, ref)


@child_only
@pytest.mark.parametrize("name", ["fp8-16x32", "awq-g64-asym", "nvfp4"])
def test_fused_moe_bits_do_not_depend_on_slots_or_chunks(qp, name):
    from xinfer.kernels import quant_launch

    fmt, hidden, ids, weights, w13, w2, inter = _moe_case(name, torch.float16)
    tiles = quant_launch.QuantTiles(block_m=16, block_n=16, block_k=32)
    out = quant_launch.fused_moe(hidden, ids, weights, fmt, w13, w2, inter, use_gemv=False,
                                 tiles=tiles)  # fmt: skip
    # the same experts at permuted slots of a larger set whose other slots hold garbage
    slots, g = 8, torch.Generator().manual_seed(8)
    perm = torch.randperm(slots, generator=g)[:5]

    def to_slots(t):
        s = t[torch.randint(0, 5, (slots,), generator=g)].clone()
        s[perm] = t
        return s

    s13 = {n: to_slots(t) for n, t in w13.items()}
    s2 = {n: to_slots(t) for n, t in w2.items()}
    slot_ids = perm[ids.long()].to(torch.int32)
    cfg = quant_launch.moe_launch.MoeConfig(block_m=16, block_n=16, block_k=32, num_warps=4)
    kw13, kw2 = fmt.kernel_weights(s13, hidden.shape[1]), fmt.kernel_weights(s2, inter)
    for chunk in (None, 3):
        out_s = qp.fused_moe(hidden, slot_ids, weights, kw13, kw2, inter, cfg, chunk=chunk)
        assert torch.equal(out, out_s), chunk


@child_only
@pytest.mark.parametrize("name", ["fp8-16x32", "gptq-g32-sym"])
def test_fused_moe_on_a_large_view_runs_only_the_ids_it_uses(qp, name, monkeypatch):
    """An offload slot view has many more rows than a call can use (later layers' slots, the
    shared regions): the call dequantizes the ids it uses and runs cdiv(max_ids, chunk) rounds
    of grouped GEMMs, not one a chunk of the view's rows, with the resident call's bits."""
    from xinfer.kernels import moe_launch

    dtype = torch.float16
    fmt, hidden, _, weights, w13, w2, inter = _moe_case(name, dtype, num_experts=5)
    hidden_dim = hidden.shape[1]
    g = torch.Generator().manual_seed(9)
    ids = torch.tensor([[4, 1], [1, 0], [0, 4], [4, 0], [1, 4], [0, 1], [4, 1]])  # 2 unused
    rows = torch.tensor([2, 37, 5, 60, 38])  # expert → its row: slots at the start, overflow
    num_rows = 64

    def to_view(t):  # garbage (other experts' bytes) in every row no call of ours uses
        v = t[torch.randint(0, 5, (num_rows,), generator=g)].clone()
        v[rows] = t
        return v

    v13 = fmt.kernel_weights({n: to_view(t) for n, t in w13.items()}, hidden_dim)
    v2 = fmt.kernel_weights({n: to_view(t) for n, t in w2.items()}, inter)
    r13, r2 = fmt.kernel_weights(w13, hidden_dim), fmt.kernel_weights(w2, inter)
    cfg = moe_launch.MoeConfig(block_m=16, block_n=16, block_k=32, num_warps=4)
    resident = qp.fused_moe(hidden, ids, weights, r13, r2, inter, cfg, chunk=2)
    d13 = _twin_set(fmt, w13, 2 * inter, hidden_dim, dtype)
    d2 = _twin_set(fmt, w2, hidden_dim, inter, dtype)
    ref = moe_launch.fused_moe(hidden, ids, weights, d13, d2, config=cfg, use_gemv=False)
    assert torch.equal(resident, ref)

    rounds, dequantized = [], []
    grouped, dequantize = moe_launch.grouped_outputs, qp.dequantize

    def count_grouped(*args, **kwargs):
        rounds.append(1)
        return grouped(*args, **kwargs)

    def count_dequantize(kw, n, k, out, first=0, ids=None):
        dequantized.extend(e for e in ids[first : first + out.shape[0]].tolist() if e >= 0)
        return dequantize(kw, n, k, out, first, ids)

    monkeypatch.setattr(moe_launch, "grouped_outputs", count_grouped)
    monkeypatch.setattr(qp, "dequantize", count_dequantize)
    slot_ids = rows[ids].to(torch.int32)
    for chunk, max_ids, want_rounds in ((2, 5, 3), (2, None, 7), (None, 5, 1), (1, 5, 5)):
        rounds.clear()
        dequantized.clear()
        out = qp.fused_moe(hidden, slot_ids, weights, v13, v2, inter, cfg, chunk, max_ids)
        assert torch.equal(out, resident), (chunk, max_ids)
        # None: bounded by the 14 pairs, not by the 64 rows; the 3 used rows, once a projection
        assert len(rounds) == want_rounds, (chunk, max_ids, len(rounds))
        assert sorted(dequantized) == [2, 2, 37, 37, 38, 38], (chunk, max_ids)


@child_only
@pytest.mark.parametrize("name", ["fp8-16x32", "gptq-g32-sym", "nvfp4"])
def test_joined_call_gives_each_row_its_bits(qp, name):
    """One call over two chunks' pairs (a prompt pass joining them, runner/expert_merge.py)
    == each chunk's own call with the same tiles, bit for bit."""
    from xinfer.kernels import moe_launch

    fmt, hidden, ids, weights, w13, w2, inter = _moe_case(name, torch.float16, tokens=14)
    cfg = moe_launch.MoeConfig(block_m=16, block_n=16, block_k=32, num_warps=4)
    kw13, kw2 = fmt.kernel_weights(w13, hidden.shape[1]), fmt.kernel_weights(w2, inter)
    own = [qp.fused_moe(hidden[s], ids[s], weights[s], kw13, kw2, inter, cfg)
           for s in (slice(0, 9), slice(9, 14))]  # fmt: skip
    joined = qp.fused_moe(hidden, ids, weights, kw13, kw2, inter, cfg)
    assert torch.equal(joined, torch.cat(own))
