"""Split-K decode linears of each kernel family — the float skinny GEMM (`gemv_launch`), two
quantized formats (block FP8, GPTQ int4) and two GGUF types, in the GEMV form and the 16-row
dot tile — as zero-argument closures, for
the tests that compare the fused split reduce with the reduce kernel bit for bit
(`test_split_reduce_*`). Each `make(rows, bias, seed, device, large)` builds fresh random
weights whose K splits at `rows` rows; `large` gives the Qwen3-30B-A3B o_proj (2048 x 4096;
GGUF 512 x 4096, which still splits K under the four-row decode tiles),
else small sizes off the tile multiples."""

from __future__ import annotations

import numpy as np
import torch
from fused_tails import run_switched


def _inputs(rows, n, k, bias, seed, device, dtype):
    g = torch.Generator(device).manual_seed(seed)
    x = (torch.randn(rows, k, generator=g, device=device) * 0.1).to(dtype)
    b = torch.randn(n, generator=g, device=device).to(dtype) if bias else None
    return x, b, g


def _float(rows, bias, seed, device="cpu", large=False):
    from xinfer.kernels import gemv_launch

    n, k = (2048, 4096) if large else (37, 400)
    dtype = torch.bfloat16 if device != "cpu" else torch.float16
    x, b, g = _inputs(rows, n, k, bias, seed, device, dtype)
    w = (torch.randn(n, k, generator=g, device=device) / k**0.5).to(dtype)
    cfg = gemv_launch.GemvConfig(block_n=32, block_k=128, num_warps=4, num_stages=4, split_k=4)
    return lambda: gemv_launch.linear(x, w, b, config=cfg)


def _quant(name: str, dot: bool = False):
    def make(rows, bias, seed, device="cpu", large=False):
        from quant_weights import random_weights

        from xinfer.kernels import quant_launch
        from xinfer.quant.fp8 import Fp8Block
        from xinfer.quant.gptq import GptqInt4

        if name == "fp8":
            fmt = Fp8Block(128, 128) if large else Fp8Block(16, 32)
        else:
            fmt = GptqInt4(group_size=128 if large else 32, has_zero=False)
        n, k = (2048, 4096) if large else (24, 2048)
        dtype = torch.bfloat16 if device != "cpu" else torch.float32
        tensors = random_weights(fmt, n, k, seed, device=device)
        x, b, _ = _inputs(rows, n, k, bias, seed, device, dtype)
        tiles = quant_launch.QuantTiles(block_m=16, block_n=32, block_k=128) if dot else None
        return lambda: quant_launch.linear(x, fmt, tensors, b, n, k, tiles=tiles)

    return make


def _gguf(name: str, block_m: int = 16):
    def make(rows, bias, seed, device="cpu", large=False):
        import gguf_files as gf

        from xinfer.kernels import gguf_launch, gguf_tiles
        from xinfer.quant.gguf_blocks import BLOCK_TYPES

        bt = BLOCK_TYPES[name]
        n = 512 if large else 19  # large: the default decode tiles (4 rows) still split K
        k = 4096 if large else bt.block_size * (3 if name.endswith("_K") else 13)
        raw = torch.from_numpy(gf.random_blocks(name, n, k, np.random.default_rng(seed)))
        dtype = torch.bfloat16 if device != "cpu" else torch.float32
        x, b, _ = _inputs(rows, n, k, bias, seed, device, dtype)
        tiles = None if large else gguf_tiles.GGUFTiles(block_m, 16, 2)
        w = raw.to(device)
        return lambda: gguf_launch.linear(x, w, bt, b, n, k, tiles=tiles)

    return make


LINEARS = {
    "float": _float,
    "fp8": _quant("fp8"),  # the GEMV form (the decode default)
    "gptq": _quant("gptq"),
    "fp8-dot": _quant("fp8", dot=True),  # the 16-row dot tile
    "gguf-q4_k": _gguf("Q4_K"),  # small: the dot tile; large: the default (GEMV form)
    "gguf-q8_0": _gguf("Q8_0"),
    "gguf-q8_0-gemv": _gguf("Q8_0", block_m=1),
}


def run_reduced(launcher, monkeypatch, call, fused: bool):
    """(output, separate reduce launches) of `call` with `FUSED_SPLIT_REDUCE` = `fused`."""
    return run_switched(launcher, "FUSED_SPLIT_REDUCE", "reduce_splits", monkeypatch, call, fused)
