"""The GGUF decode GEMVs on int8 activations (`kernels/gguf_q8x_launch.py`) on the GPU, where
`dp4a` and `mul.rn` are inline PTX: the activation quantizer equals its twin bit for bit;
the Q4_K, Q8_0 and Q6_K MoE and linear at Qwen3-30B-A3B shapes equal their twins, a row's
bits do not depend on the batch or on the slots, and CUDA graphs replay them (the fused
combine's and split reduce's counters back at zero)."""

from __future__ import annotations

import gguf_files as gf
import pytest
import torch

pytestmark = pytest.mark.gpu
triton = pytest.importorskip("triton")
tl = triton.language
from xinfer.kernels.triton.gguf_q8x import quantize_blocks  # noqa: E402

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _experts(rows: int, k: int, seed: int, experts: int, name: str = "Q4_K") -> torch.Tensor:
    return gf.random_block_rows(name, rows, k, seed, experts, CUDA)


@triton.jit
def _quantize_kernel(x_ptr, w_ptr, d_ptr, s_ptr, stride_x, S: tl.constexpr):
    """Row `program_id` of S blocks of 32 through `quantize_blocks` (mul.rn as PTX)."""
    r = tl.program_id(0)
    b = tl.arange(0, S)
    v = tl.load(x_ptr + r * stride_x + b[:, None] * 32 + tl.arange(0, 32)[None, :])
    words, d, s = quantize_blocks(v.to(tl.float32), True)
    tl.store(w_ptr + r * S * 8 + b[:, None] * 8 + tl.arange(0, 8)[None, :], words)
    tl.store(d_ptr + r * S + b, d)
    tl.store(s_ptr + r * S + b, s)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_equals_the_twin(dtype):
    from xinfer.kernels import gguf_q8x_reference as ref

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(9, 256, generator=g) * 2).to(dtype)
    x[3, 64:96] = 0
    x[4, :32] = torch.arange(32) - 15.5  # ties after the multiply (d = 1)
    x[4, 0] = 127
    xc = x.to(CUDA)
    words = torch.empty(9, 64, dtype=torch.int32, device=CUDA)
    d = torch.empty(9, 8, device=CUDA)
    s = torch.empty_like(d)
    _quantize_kernel[(9,)](xc, words, d, s, xc.stride(0), S=8)
    for a, b in zip((words, d, s), ref.quantize_rows(x), strict=True):
        assert torch.equal(a.cpu(), b)


@pytest.mark.parametrize(
    "t13,t2,inter",
    [("Q4_K", "Q4_K", 768), ("Q8_0", "Q8_0", 768), ("Q4_K", "Q6_K", 768), ("Q8_0", "Q8_0", 1408)],
)  # the last: Qwen1.5's intermediate size (ISQ's Q8_0 fallback), ending inside a step
def test_moe_equals_the_twin_keeps_bits_and_replays(t13, t2, inter):
    from xinfer.kernels import gguf_q8x_launch as ql
    from xinfer.kernels import gguf_q8x_reference as ref
    from xinfer.kernels import reference
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    hidden_dim, experts, tokens = 2048, 8, 4
    w13 = _experts(2 * inter, hidden_dim, 1, experts, t13)
    w2 = _experts(hidden_dim, inter, 2, experts, t2)
    b13, b2 = BLOCK_TYPES[t13], BLOCK_TYPES[t2]
    assert ql.supports(b13, b2, w13, w2, inter)
    g = torch.Generator().manual_seed(3)
    hidden = (torch.randn(tokens, hidden_dim, generator=g) * 0.05).to(torch.bfloat16)
    weights, ids = reference.route_topk(torch.randn(tokens, experts, generator=g), 4, True)
    hidden, ids, weights = hidden.to(CUDA), ids.to(CUDA), weights.to(CUDA)

    def run(h, i, w, e13=w13, e2=w2):
        return ql.fused_moe(h, i, w, e13, b13, e2, b2, inter)

    out = run(hidden, ids, weights)
    want = ref.moe(hidden.cpu(), ids.cpu(), weights.cpu(), w13.cpu(), t13, w2.cpu(), t2, inter)
    scale = want.float().abs().max()  # bf16 outputs, rounded by both: a few ulp apart
    torch.testing.assert_close(out.cpu().float() / scale, want.float() / scale, rtol=0, atol=1e-2)
    assert torch.equal(run(hidden[2:3], ids[2:3], weights[2:3])[0], out[2])
    perm = torch.randperm(12, generator=g)[:experts].to(CUDA)
    s13 = torch.zeros((12, *w13.shape[1:]), dtype=w13.dtype, device=CUDA)
    s2 = torch.zeros((12, *w2.shape[1:]), dtype=w2.dtype, device=CUDA)
    s13[perm], s2[perm] = w13, w2
    assert torch.equal(run(hidden, perm[ids.long()].to(torch.int32), weights, s13, s2), out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(hidden, ids, weights)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, out)


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q6_K"])
@pytest.mark.parametrize("n,k", [(5120, 2048), (2048, 4096)])  # qkv, o_proj
def test_linear_equals_the_twin_keeps_bits_and_replays(name, n, k):
    from xinfer.kernels import gguf_q8x_launch as ql
    from xinfer.kernels import gguf_q8x_reference as ref
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    w = _experts(n, k, 4, 1, name)[0]
    bt = BLOCK_TYPES[name]
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(5, k, generator=g) * 0.1).to(torch.bfloat16).to(CUDA)
    bias = torch.randn(n, generator=g).to(torch.bfloat16).to(CUDA)
    out = ql.linear(x, w, bt, bias, n)
    want = ref.linear(x.cpu(), w.cpu(), name, bias.cpu())
    scale = want.float().abs().max()
    torch.testing.assert_close(out.cpu().float() / scale, want.float() / scale, rtol=0, atol=1e-2)
    assert torch.equal(ql.linear(x[2:3], w, bt, bias, n)[0], out[2])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ql.linear(x, w, bt, bias, n)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, out)
