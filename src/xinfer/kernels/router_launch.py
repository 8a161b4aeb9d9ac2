"""Launcher of the router GEMV with its top-k in one launch (`triton/router_topk.py`): a
decode-sized MoE layer's routing, two launches made one. No host sync: safe in CUDA graphs.

`kernels.router_topk` sends decode routing of at most MAX_ROWS rows here while ENABLED is
on. It applies (`router_topk` returns None otherwise, and the caller runs the router linear
and `route_topk` apart) to at most `gemv_launch.MAX_M` rows, x and the (E, K) weight of one
float dtype, no bias, E at most MAX_EXPERTS, with arrival counters at hand (`arrivals`; made
at the first call outside a CUDA graph capture). Which path a row takes may depend on the
batch (MAX_ROWS), its bits do not: the one launch has the two launches' bits.

Tiles: the GEMV's table entry for (E, K) (`gemv_launch.select`), or ROUTER_CONFIG where the
table picks cuBLAS or lacks the shape. Warps: `routing.TOPK_WARPS`, those `route_topk`
launches its top-k with, so that the fused choice equals the two launches' bit for bit (a
GEMV tile's bits do not depend on its warps)."""

from __future__ import annotations

import torch
import triton

from xinfer.kernels import arrivals, gemv_launch, pdl
from xinfer.kernels.triton import router_topk as jit
from xinfer.kernels.triton import routing

# on: the H100 ran `tests/kernels/test_router_topk_gpu.py` (the two launches' bits) and
# `bench/bench_decode_switches.py` (thirtieth session): +1.6% (bf16) / +1.7% (GPTQ) batch-1
# decode, but -7% / -5% at batch 8 (one program a row does the top-k after the GEMV), so
# `kernels.router_topk` sends it calls of at most MAX_ROWS rows. The choice by rows cannot
# change a row's bits: the one launch has the two launches' bits. Off: always apart.
ENABLED = True
MAX_ROWS = 1
MAX_EXPERTS = 1024  # one program holds a token's logits for its top-k
ROUTER_CONFIG = gemv_launch.GemvConfig(block_n=16, block_k=256, num_stages=4, split_k=8)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `router_topk` takes x (T, K) and weight (E, K) (shapes and dtypes only)."""
    rows = x.shape[0] if x.dim() == 2 else -1
    return (
        0 < rows <= gemv_launch.MAX_M
        and x.dtype in _DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and weight.shape[1] == x.shape[1]
        and weight.stride(1) == 1
        and 0 < weight.shape[0] <= MAX_EXPERTS
    )


def config(num_experts: int, k: int, m: int, dtype: torch.dtype) -> gemv_launch.GemvConfig:
    """The GEMV tiles of an (E, K) router at m rows: the skinny GEMM's own (its table, or
    FP32_CONFIG), ROUTER_CONFIG where that table picks cuBLAS or lacks the shape."""
    return gemv_launch.select(num_experts, k, m, dtype) or ROUTER_CONFIG


def router_topk(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(topk_weights float32 (T, k), topk_ids int32 (T, k)) of the router logits x @ weight^T
    in one launch, or None where it does not apply (`applies`, and no counters inside a
    capture that found none made)."""
    if not applies(x, weight):
        return None
    num_experts, k = weight.shape
    if not 0 < top_k <= num_experts:
        raise ValueError(f"router_topk: top_k={top_k} must be in [1, {num_experts}]")
    counters = arrivals.counters(x.device, 1)
    if counters is None:
        return None
    x2 = x if x.stride(-1) == 1 else x.contiguous()
    m = x2.shape[0]
    cfg = config(num_experts, k, m, x.dtype)
    align = gemv_launch.SPLIT_ALIGN
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), align) * align
    splits = triton.cdiv(k, k_per_split)
    logits = x2.new_empty(m, num_experts)
    part = logits.new_empty(splits, m, num_experts, dtype=torch.float32) if splits > 1 else logits
    weights = torch.empty(m, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(m, top_k, dtype=torch.int32, device=x.device)
    jit.router_topk_kernel[(triton.cdiv(num_experts, cfg.block_n), splits)](
        x2, weight, part, logits, weights, ids, counters,
        m, num_experts, k, k_per_split,
        x2.stride(0), weight.stride(0), part.stride(0) if splits > 1 else 0, part.stride(-2),
        logits.stride(0),
        SPLIT=splits > 1, TOP_K=top_k, RENORMALIZE=renormalize,
        BLOCK_M=gemv_launch.MAX_M, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        BLOCK_E=triton.next_power_of_2(num_experts),
        BLOCK_TK=triton.next_power_of_2(top_k),
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=routing.TOPK_WARPS, num_stages=cfg.num_stages, **pdl.options(x2),
    )  # fmt: skip
    return weights, ids
