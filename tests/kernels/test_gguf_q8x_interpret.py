"""The GGUF decode GEMVs on int8 activations (`kernels/gguf_q8x_launch.py`) in Triton's CPU
interpreter: `dp4a`'s interpreter form equals the four signed byte products summed; the
activation quantizer equals its twin bit for bit (codes, scales, sums; a block of zeros;
ties); the Q4_K MoE and linear equal their twins (`gguf_q8x_reference`), a row's bits do not
depend on the batch or the slot that holds its expert; `gguf_launch` takes them when
switched on, for decode only; and the twin itself stays within int8 rounding of the float
twin (the dequantized weights, `GGUFFormat.reference_moe`), which checks its reading of the
Q4_K layout against the one tested against the `gguf` package.

Runs in a child pytest with TRITON_INTERPRET=1 (see interpreter_child.py)."""

from __future__ import annotations

import gguf_files as gf
import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted

triton = pytest.importorskip("triton")
tl = triton.language
from xinfer.kernels.triton.gguf_q8x import dp4a, quantize_blocks  # noqa: E402

test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(scope="module")
def ql():
    from xinfer.kernels import gguf_q8x_launch
    from xinfer.kernels.triton import gguf_q8x

    require_interpreted(gguf_q8x.q8x_linear_kernel)
    return gguf_q8x_launch


def _experts(name: str, rows: int, k: int, seed: int, experts: int) -> torch.Tensor:
    return gf.random_block_rows(name, rows, k, seed, experts)


def _case(
    t13: str, t2: str, seed: int, tokens: int = 2, hidden_dim: int = 512, inter: int = 256,
    experts: int = 3,
):  # fmt: skip
    from xinfer.kernels import reference

    w13 = _experts(t13, 2 * inter, hidden_dim, seed, experts)
    w2 = _experts(t2, hidden_dim, inter, seed + 1, experts)
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, hidden_dim, generator=g) * 0.05
    weights, ids = reference.route_topk(torch.randn(tokens, experts, generator=g), 2, True)
    return hidden, ids, weights, w13, w2, inter


def _bt(name: str):
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    return BLOCK_TYPES[name]


@triton.jit
def _dp4a_kernel(a_ptr, b_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, dp4a(tl.load(a_ptr + offs), tl.load(b_ptr + offs), False))


@child_only
def test_dp4a_sums_the_signed_byte_products(ql):
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-(2**31), 2**31 - 1, (64,), generator=g, dtype=torch.int64).to(torch.int32)
    b = torch.randint(-(2**31), 2**31 - 1, (64,), generator=g, dtype=torch.int64).to(torch.int32)
    a[0], b[0] = -1, 0x7F7F7F7F  # bytes -1 · 127
    out = torch.empty(64, dtype=torch.int32)
    _dp4a_kernel[(1,)](a, b, out, N=64)
    bytes_a = a.view(torch.int8).reshape(64, 4).to(torch.int32)
    bytes_b = b.view(torch.int8).reshape(64, 4).to(torch.int32)
    assert torch.equal(out, (bytes_a * bytes_b).sum(dim=1))
    assert out[0] == -4 * 127


@triton.jit
def _quantize_kernel(x_ptr, w_ptr, d_ptr, s_ptr, S: tl.constexpr):
    """One row of S blocks of 32 through `quantize_blocks`."""
    b = tl.arange(0, S)
    v = tl.load(x_ptr + b[:, None] * 32 + tl.arange(0, 32)[None, :]).to(tl.float32)
    words, d, s = quantize_blocks(v, False)
    tl.store(w_ptr + b[:, None] * 8 + tl.arange(0, 8)[None, :], words)
    tl.store(d_ptr + b, d)
    tl.store(s_ptr + b, s)


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_equals_the_twin_bit_for_bit(ql, dtype):
    from xinfer.kernels import gguf_q8x_reference as ref

    g = torch.Generator().manual_seed(1)
    x = (torch.randn(1, 256, generator=g) * 3).to(dtype)
    x[0, 64:96] = 0  # a block of zeros: d = 0, codes 0
    x[0, :32] = torch.arange(32) - 15.5  # with amax 127 (d = 1): ties, rounded to even
    x[0, 0] = 127
    words = torch.empty(64, dtype=torch.int32)
    d, s = torch.empty(8), torch.empty(8)
    _quantize_kernel[(1,)](x, words, d, s, S=8)
    want = ref.quantize_rows(x)
    for a, b in zip((words, d, s), (w[0] for w in want), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert d[2] == 0 and (words[16:24] == 0).all()
    codes = ref.quantize_codes(x)[0][0, :32]
    assert codes[1:5].tolist() == [-14, -14, -12, -12]  # -14.5, -13.5, -12.5, -11.5


@child_only
@pytest.mark.parametrize(
    "t13,t2,inter",
    [("Q4_K", "Q4_K", 512), ("Q8_0", "Q4_K", 256), ("Q4_K", "Q8_0", 256), ("Q4_K", "Q6_K", 256)],
)  # the last: a Q4_K_M file's experts
def test_moe_equals_the_twin_and_keeps_row_bits(ql, t13, t2, inter):
    """Each pairing of the two types (down over two steps once: the quantized h read back);
    the batch and slot checks once (the same programs for every type; the linear test runs
    the loops over several steps of x quantized in the program)."""
    from xinfer.kernels import gguf_q8x_reference as ref

    hidden, ids, weights, w13, w2, inter = _case(t13, t2, seed=3, hidden_dim=256, inter=inter)
    b13, b2 = _bt(t13), _bt(t2)
    assert ql.supports(b13, b2, w13, w2, inter)
    out = ql.fused_moe(hidden, ids, weights, w13, b13, w2, b2, inter)
    want = ref.moe(hidden, ids, weights, w13, t13, w2, t2, inter)
    scale = want.abs().max()
    torch.testing.assert_close(out / scale, want / scale, rtol=0, atol=1e-5)
    if t13 != t2:
        return
    # one token alone: its bits in the batch; its experts on a permuted, larger slot set too
    alone = ql.fused_moe(hidden[1:2], ids[1:2], weights[1:2], w13, b13, w2, b2, inter)
    assert torch.equal(alone[0], out[1])
    perm = torch.tensor([4, 0, 2])
    s13 = torch.zeros((5, *w13.shape[1:]), dtype=w13.dtype)
    s2 = torch.zeros((5, *w2.shape[1:]), dtype=w2.dtype)
    s13[perm], s2[perm] = w13, w2
    slot_ids = perm[ids.long()].to(torch.int32)
    assert torch.equal(ql.fused_moe(hidden, slot_ids, weights, s13, b13, s2, b2, inter), out)


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q6_K"])
def test_the_twin_is_the_float_twin_within_int8_rounding(name):
    """Runs in the parent too (pure torch): the q8x twin against the dequantized-weight twin
    on the same experts — a wrong nibble, scale or sign would be far outside this."""
    from xinfer.kernels import gguf_q8x_reference as ref
    from xinfer.quant.gguf_formats import GGUFFormat

    hidden, ids, weights, w13, w2, inter = _case(name, name, seed=5, tokens=3)
    fmt = GGUFFormat(name)
    floats = fmt.reference_moe(hidden, ids, weights, {"weight": w13}, {"weight": w2}, inter, fmt)
    q8x = ref.moe(hidden, ids, weights, w13, name, w2, name, inter)
    err = (q8x - floats).abs().max() / floats.abs().max()
    assert 0 < err < 2e-2, err
    # and the dot alone, one row: within the activations' rounding (1/254 of a block's max)
    bt = fmt.btype
    dense = bt.dequantize_blocks(w2[0].reshape(-1, bt.type_size)).reshape(w2.shape[1], inter)
    h = torch.randn(1, inter, generator=torch.Generator().manual_seed(6))
    exact = h @ dense.T
    rel = (ref.dot(w2[0], h, name) - exact).abs().max() / exact.abs().max()
    assert rel < 1e-2, rel


def test_supports_only_whole_steps_of_q4_k_q8_0_and_q6_k():
    from xinfer.kernels import gguf_q8x_launch as ql

    q4k, q8, q6k = _bt("Q4_K"), _bt("Q8_0"), _bt("Q6_K")
    w13 = torch.zeros(2, 512, 144, dtype=torch.uint8)
    w2 = torch.zeros(2, 256, 144, dtype=torch.uint8)
    assert ql.supports(q4k, q4k, w13, w2, 256)
    assert not ql.supports(q4k, _bt("Q5_K"), w13, w2, 256)  # not read here
    assert ql.supports(q4k, q6k, w13, torch.zeros(2, 256, 210, dtype=torch.uint8), 256)
    assert not ql.supports(q4k, q4k, w13, w2, 160)  # Q4_K rows are whole 256-steps
    w8 = torch.zeros(2, 512, 272, dtype=torch.uint8)  # Q8_0: 34-byte blocks, 2-byte aligned
    assert ql.supports(q8, q4k, w8, w2, 256)
    assert not ql.supports(q8, q4k, w8[:, :, 1:], w2, 256)  # odd row starts


@child_only
def test_gguf_launch_takes_it_when_switched_on_for_decode_only(ql, monkeypatch):
    from xinfer.kernels import gguf_launch
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    hidden, ids, weights, w13, w2, inter = _case("Q4_K", "Q4_K", 7, tokens=1, hidden_dim=256)
    q4k = BLOCK_TYPES["Q4_K"]
    calls, fused_moe = [], ql.fused_moe
    monkeypatch.setattr(ql, "fused_moe", lambda *a: calls.append(1) or fused_moe(*a))
    monkeypatch.setattr(gguf_launch, "Q8X_MOE", True)
    out = gguf_launch.fused_moe(hidden, ids, weights, w13, q4k, w2, q4k, inter)
    want = fused_moe(hidden, ids, weights, w13, q4k, w2, q4k, inter)
    assert calls == [1] and torch.equal(out, want)
    gguf_launch.fused_moe(hidden, ids, weights, w13, q4k, w2, q4k, inter, use_gemv=False)
    assert calls == [1]  # the grouped (prefill) path keeps its float kernels


@child_only
@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q6_K"])
def test_linear_splits_k_equals_the_twin_and_keeps_row_bits(ql, name):
    """K = 2048 (8 steps of 256): the linear splits K (partials added by each tile's last
    split, bias there); rows alone give their bits in 5."""
    from xinfer.kernels import gemv_launch
    from xinfer.kernels import gguf_q8x_reference as ref

    n, k = 40, 2048
    w = _experts(name, n, k, seed=9, experts=1)[0]
    bt = _bt(name)
    assert ql.supports_linear(bt, w, k)
    n_tiles = -(-n // ql.LINEAR_BLOCK_N)
    assert gemv_launch.decode_split(5, n_tiles, k, 256)[1] > 1  # K is split
    g = torch.Generator().manual_seed(10)
    x = torch.randn(5, k, generator=g) * 0.1
    bias = torch.randn(n, generator=g)
    out = ql.linear(x, w, bt, bias, n)
    want = ref.linear(x, w, name, bias)
    scale = want.abs().max()
    torch.testing.assert_close(out / scale, want / scale, rtol=0, atol=1e-5)
    assert torch.equal(ql.linear(x[3:4], w, bt, bias, n)[0], out[3])
    assert torch.equal(ql.linear(x[1:3], w, bt, None, n), ql.linear(x, w, bt, None, n)[1:3])


@child_only
def test_gguf_launch_linear_takes_it_when_switched_on_for_decode_only(ql, monkeypatch):
    from xinfer.kernels import gguf_launch
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    n, k = 16, 256
    w = _experts("Q4_K", n, k, seed=11, experts=1)[0]
    q4k = BLOCK_TYPES["Q4_K"]
    calls, linear = [], ql.linear
    monkeypatch.setattr(ql, "linear", lambda *a: calls.append(1) or linear(*a))
    monkeypatch.setattr(gguf_launch, "Q8X_LINEAR", True)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(12))
    out = gguf_launch.linear(x, w, q4k, None, n, k)
    assert calls == [1] and torch.equal(out, linear(x, w, q4k, None, n))
    gguf_launch.linear(x, w, q4k, None, n, k, dequant=True)  # prefill: the float route
    assert calls == [1]


@child_only
def test_q8_0_rows_ending_inside_a_step(ql):
    """Q8_0 rows of any multiple of 32 (ISQ's fallback for rows not a multiple of 256, e.g.
    Qwen1.5's 1408): hidden 288 and intermediate 96 in the MoE, K = 352 in the linear; the
    blocks past the row read as zeros."""
    from xinfer.kernels import gguf_q8x_reference as ref

    q8 = _bt("Q8_0")
    hidden, ids, weights, w13, w2, inter = _case("Q8_0", "Q8_0", 13, 1, hidden_dim=288, inter=96)
    assert ql.supports(q8, q8, w13, w2, inter)
    out = ql.fused_moe(hidden, ids, weights, w13, q8, w2, q8, inter)
    want = ref.moe(hidden, ids, weights, w13, "Q8_0", w2, "Q8_0", inter)
    torch.testing.assert_close(out / want.abs().max(), want / want.abs().max(), rtol=0, atol=1e-5)
    n, k = 24, 352
    w = _experts("Q8_0", n, k, seed=14, experts=1)[0]
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(15))
    got, want = ql.linear(x, w, q8, None, n), ref.linear(x, w, "Q8_0", None)
    torch.testing.assert_close(got / want.abs().max(), want / want.abs().max(), rtol=0, atol=1e-5)
