"""GPU check of the quantized gate/up GEMV with the gate and up tiles in one loop
(`QuantTiles.joined`): the same bits as one loop after the other (each sum's arithmetic is
the same; only the loop form changes), factored or not, on shapes whose loops run several
iterations."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from quant_weights import random_weights

from xinfer.kernels import quant_launch as ql
from xinfer.kernels import reference
from xinfer.quant.fp8 import Fp8Block
from xinfer.quant.gptq import GptqInt4
from xinfer.quant.nvfp4 import Nvfp4

pytestmark = pytest.mark.gpu
DEV = "cuda"
QUANT = {
    "fp8": Fp8Block(128, 128),
    "gptq-asym": GptqInt4(group_size=128, has_zero=True),
    "nvfp4": Nvfp4(),
}


@pytest.mark.parametrize("name", list(QUANT))
def test_joined_gate_up_gemv_gives_the_two_loops_bits(name) -> None:
    fmt = QUANT[name]
    hidden, inter, experts = 2048, 768, 16
    w13 = random_weights(fmt, 2 * inter, hidden, 4, experts, DEV)
    w2 = random_weights(fmt, hidden, inter, 5, experts, DEV)
    g = torch.Generator(device=DEV).manual_seed(6)
    weights, ids = reference.route_topk(torch.randn(3, experts, device=DEV, generator=g), 8, True)
    x = torch.randn(3, hidden, device=DEV, generator=g).to(torch.bfloat16)
    base = ql.gemv_tiles(fmt, fmt.kernel_weights(w13, hidden))
    for factored in (False, True):
        t = dataclasses.replace(base, factored=factored, joined=False)
        plain = ql.fused_moe(x, ids, weights, fmt, w13, w2, inter, use_gemv=True, tiles=t)
        joined = ql.fused_moe(
            x, ids, weights, fmt, w13, w2, inter, use_gemv=True,
            tiles=dataclasses.replace(t, joined=True),
        )  # fmt: skip
        assert torch.equal(joined, plain), f"{name} MoE {factored=}"
