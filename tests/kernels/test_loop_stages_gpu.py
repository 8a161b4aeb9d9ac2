"""GPU checks of the software-pipelined GEMV loops (`loop_stages` of `GGUFTiles` and
`QuantTiles`): with 2 or 3 iterations' loads in flight, the GGUF and quantized MoE GEMVs and
GEMV-form decode linears give the same bits as with none (the arithmetic is the same; only
when the loads are issued changes), and so does the quantized gate/up GEMV with both tiles
in one loop (`QuantTiles.joined`), on shapes whose loops run several iterations and
split-K ranges, and the pipelined kernels replay inside a CUDA graph."""

from __future__ import annotations

import dataclasses

import gguf_files as gf
import pytest
import torch
from quant_weights import random_weights

from xinfer.kernels import gguf_launch as gl
from xinfer.kernels import quant_launch as ql
from xinfer.kernels import reference
from xinfer.quant.fp8 import Fp8Block
from xinfer.quant.gguf_blocks import BLOCK_TYPES
from xinfer.quant.gptq import GptqInt4
from xinfer.quant.nvfp4 import Nvfp4

pytestmark = pytest.mark.gpu
DEV = "cuda"
STAGES = [2, 3]
QUANT = {
    "fp8": Fp8Block(128, 128),
    "gptq-asym": GptqInt4(group_size=128, has_zero=True),
    "nvfp4": Nvfp4(),
}


def _raw(name: str, rows: int, k: int, seed: int, experts: int | None = None) -> torch.Tensor:
    return gf.random_block_rows(name, rows, k, seed, experts, DEV)


def _routing(tokens: int, experts: int, seed: int):
    g = torch.Generator(device=DEV).manual_seed(seed)
    weights, ids = reference.route_topk(
        torch.randn(tokens, experts, device=DEV, generator=g), 8, True
    )
    return g, weights, ids


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q6_K", "Q5_0"])
@pytest.mark.parametrize("stages", STAGES)
def test_gguf_moe_gemv_bits_do_not_depend_on_the_stages(name, stages) -> None:
    hidden, inter, experts = 2048, 1280, 16  # several chunks a loop, an odd count for down
    bt = BLOCK_TYPES[name]
    w13 = _raw(name, 2 * inter, hidden, 1, experts)
    w2 = _raw(name, hidden, inter, 2, experts)
    for tokens in (1, 5):
        g, weights, ids = _routing(tokens, experts, tokens)
        x = (torch.randn(tokens, hidden, device=DEV, generator=g) * 0.05).to(torch.bfloat16)
        base = gl.gemv_tiles(x.dtype, bt)
        plain = gl.fused_moe(x, ids, weights, w13, bt, w2, bt, inter, True, base)
        piped = gl.fused_moe(
            x, ids, weights, w13, bt, w2, bt, inter, True,
            dataclasses.replace(base, loop_stages=stages),
        )  # fmt: skip
        assert torch.equal(piped, plain), f"{name} T={tokens} stages {stages}"


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q6_K"])
@pytest.mark.parametrize("stages", STAGES)
def test_gguf_decode_linear_bits_do_not_depend_on_the_stages(name, stages) -> None:
    n, k = 1000, 2816  # 11 chunks of 256 for the rows kernel, split-K ranges of several
    bt = BLOCK_TYPES[name]
    w = _raw(name, n, k, 3)
    x = torch.randn(7, k, device=DEV).to(torch.bfloat16)
    for tiles in (gl.GGUFTiles(4, 4, 8, 2), gl.GGUFTiles(1, 4, 8, 2)):
        plain = gl.linear(x, w, bt, None, n, k, tiles)
        piped = gl.linear(x, w, bt, None, n, k, dataclasses.replace(tiles, loop_stages=stages))
        assert torch.equal(piped, plain), f"{name} {tiles} stages {stages}"


@pytest.mark.parametrize("name", list(QUANT))
@pytest.mark.parametrize("stages", STAGES)
def test_quant_gemvs_bits_do_not_depend_on_the_stages(name, stages) -> None:
    fmt = QUANT[name]
    hidden, inter, experts = 2048, 768, 16
    w13 = random_weights(fmt, 2 * inter, hidden, 4, experts, DEV)
    w2 = random_weights(fmt, hidden, inter, 5, experts, DEV)
    g, weights, ids = _routing(3, experts, 6)
    x = torch.randn(3, hidden, device=DEV, generator=g).to(torch.bfloat16)
    base = ql.gemv_tiles(fmt.kernel_weights(w13, hidden))
    for factored in (False, True):
        t = dataclasses.replace(base, factored=factored)
        plain = ql.fused_moe(x, ids, weights, fmt, w13, w2, inter, use_gemv=True, tiles=t)
        for joined in (False, True):  # gate and up in one loop or two: same bits too
            piped = ql.fused_moe(
                x, ids, weights, fmt, w13, w2, inter, use_gemv=True,
                tiles=dataclasses.replace(t, loop_stages=stages, joined=joined),
            )  # fmt: skip
            assert torch.equal(piped, plain), f"{name} MoE {factored=} {joined=} {stages=}"
    n, k = 1024, 4096
    tensors = random_weights(fmt, n, k, 7, None, DEV)
    xl = torch.randn(5, k, device=DEV).to(torch.bfloat16)
    kw = fmt.kernel_weights(tensors, k)
    for tiles in (ql.linear_tiles(5, xl.dtype, kw, k), ql.QuantTiles(1, 8, 512, num_warps=8)):
        plain = ql.linear(xl, fmt, tensors, None, n, k, tiles=tiles)
        piped = ql.linear(
            xl, fmt, tensors, None, n, k, tiles=dataclasses.replace(tiles, loop_stages=stages)
        )
        assert torch.equal(piped, plain), f"{name} linear {tiles} stages {stages}"


def test_pipelined_gemvs_replay_in_a_cuda_graph() -> None:
    hidden, inter, experts = 2048, 768, 16
    bt = BLOCK_TYPES["Q4_K"]
    w13 = _raw("Q4_K", 2 * inter, hidden, 8, experts)
    w2 = _raw("Q4_K", hidden, inter, 9, experts)
    g, weights, ids = _routing(2, experts, 10)
    x = (torch.randn(2, hidden, device=DEV, generator=g) * 0.05).to(torch.bfloat16)
    tiles = dataclasses.replace(gl.gemv_tiles(x.dtype, bt), loop_stages=3)

    def run() -> torch.Tensor:
        return gl.fused_moe(x, ids, weights, w13, bt, w2, bt, inter, True, tiles)

    expected = run()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # warm-up (compiles) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    x.copy_((torch.randn(2, hidden, device=DEV, generator=g) * 0.05).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, run())
    assert not torch.equal(out, expected)  # the replay read the new x
