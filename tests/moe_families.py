"""Decode-sized routed-expert calls of each kernel family — the float GEMVs, two quantized
formats (block FP8, GPTQ int4) and two GGUF type pairs — as zero-argument closures, for the
tests that compare one family's launch variants bit for bit (`test_moe_combine_*`). Each
`make(tokens, top_k, dtype, seed, device, large)` builds fresh random weights; `large` gives
the Qwen3-30B-A3B layer widths (H 2048, I 768) with a few experts, else small odd sizes."""

from __future__ import annotations

import numpy as np
import torch
from fused_tails import run_switched


def _routing(tokens: int, num_experts: int, top_k: int, seed: int, device):
    from xinfer.kernels import reference

    g = torch.Generator(device).manual_seed(seed)
    logits = torch.randn(tokens, num_experts, generator=g, device=device)
    weights, ids = reference.route_topk(logits, top_k, renormalize=True)
    return weights, ids, g


def _float_family(tokens, top_k, dtype, seed, device="cpu", large=False):
    """H = 37 (off every row tile), I = 19; or 2048 / 768."""
    from xinfer.kernels import moe_launch

    num_experts, hidden_dim, inter = (16, 2048, 768) if large else (6, 37, 19)
    weights, ids, g = _routing(tokens, num_experts, top_k, seed, device)
    hidden = torch.randn(tokens, hidden_dim, generator=g, device=device).to(dtype)
    w13 = torch.randn(num_experts, 2 * inter, hidden_dim, generator=g, device=device)
    w2 = torch.randn(num_experts, hidden_dim, inter, generator=g, device=device)
    w13, w2 = (w13 / hidden_dim**0.5).to(dtype), (w2 / inter**0.5).to(dtype)
    return lambda: moe_launch.fused_moe(hidden, ids, weights, w13, w2, use_gemv=True)


def _quant_family(name: str):
    def make(tokens, top_k, dtype, seed, device="cpu", large=False):
        from quant_weights import random_weights

        from xinfer.kernels import quant_launch
        from xinfer.quant.fp8 import Fp8Block
        from xinfer.quant.gptq import GptqInt4

        if name == "fp8":
            fmt = Fp8Block(128, 128) if large else Fp8Block(16, 32)
        else:
            fmt = GptqInt4(group_size=128 if large else 32, has_zero=False)
        num_experts, hidden_dim, inter = (16, 2048, 768) if large else (5, 96, 32)
        w13 = random_weights(fmt, 2 * inter, hidden_dim, seed, num_experts, device=device)
        w2 = random_weights(fmt, hidden_dim, inter, seed + 1, num_experts, device=device)
        weights, ids, g = _routing(tokens, num_experts, top_k, seed, device)
        hidden = torch.randn(tokens, hidden_dim, generator=g, device=device).to(dtype)
        return lambda: quant_launch.fused_moe(
            hidden, ids, weights, fmt, w13, w2, inter, use_gemv=True
        )

    return make


def _gguf_family(t13: str, t2: str):
    def make(tokens, top_k, dtype, seed, device="cpu", large=False):
        import gguf_files as gf

        from xinfer.kernels import gguf_launch, gguf_tiles
        from xinfer.quant.gguf_blocks import BLOCK_TYPES

        num_experts = 16 if large else 4
        hidden_dim = 2048 if large else 256
        inter = 768 if large else (256 if t2.endswith("_K") else 96)
        rng = np.random.default_rng(seed)

        def raw(name, rows, k):
            stack = np.stack([gf.random_blocks(name, rows, k, rng) for _ in range(num_experts)])
            return torch.from_numpy(stack).to(device)

        w13, w2 = raw(t13, 2 * inter, hidden_dim), raw(t2, hidden_dim, inter)
        weights, ids, g = _routing(tokens, num_experts, top_k, seed, device)
        hidden = (torch.randn(tokens, hidden_dim, generator=g, device=device) * 0.05).to(dtype)
        # the engine's decode tiles on the GPU; a small one for the interpreter's sake
        tiles = None if large else gguf_tiles.GGUFTiles(1, 32, 8)
        b13, b2 = BLOCK_TYPES[t13], BLOCK_TYPES[t2]
        return lambda: gguf_launch.fused_moe(
            hidden, ids, weights, w13, b13, w2, b2, inter, True, tiles
        )

    return make


FAMILIES = {
    "float-kernels": _float_family,
    "fp8": _quant_family("fp8"),
    "gptq": _quant_family("gptq"),
    "gguf-q4_k-q6_k": _gguf_family("Q4_K", "Q6_K"),
    "gguf-q8_0-q5_0": _gguf_family("Q8_0", "Q5_0"),
}


def run_combined(launcher, monkeypatch, call, fused: bool):
    """(output, separate combine launches) of `call` with `FUSED_COMBINE` = `fused`."""
    return run_switched(launcher, "FUSED_COMBINE", "_combine", monkeypatch, call, fused)
