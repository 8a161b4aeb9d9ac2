"""Launchers of `triton/permute.py`: x's columns gathered into an act-order weight's column
order (`quant/act_order.py`) before the plain int4 kernels run, for a linear (`columns`) or
for the routed experts' grouped GEMM, one row a (token, expert) pair (`pair_rows`). No host
sync: safe in CUDA graphs."""

from __future__ import annotations

import torch
import triton

from xinfer.kernels import pdl
from xinfer.kernels.triton import permute as jit


def columns(x2: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """x2 (M, K) → out[m, j] = x2[m, perm[j]] (`triton/permute.py`)."""
    m, k = x2.shape
    out = torch.empty_like(x2)
    if m and k:
        block = min(1024, triton.next_power_of_2(k))
        jit.permute_columns_kernel[(m, triton.cdiv(k, block))](
            x2, perm, out, k, x2.stride(0), out.stride(0), BLOCK_K=block, **pdl.options(x2)
        )
    return out


def pair_rows(
    hidden: torch.Tensor, topk_ids: torch.Tensor, perm: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """out (T*k, H): row p = hidden[p // k] in the column order of expert topk_ids[p]'s
    w13 (`perm` (E, H)); the routed experts' gate/up kernels then read it with TOP_K 1. `out`
    may be the call's expert-output buffer (written only after the gate/up kernel read it)."""
    pairs, k = topk_ids.numel(), hidden.shape[1]
    if pairs and k:
        block = min(1024, triton.next_power_of_2(k))
        jit.permute_pair_rows_kernel[(pairs, triton.cdiv(k, block))](
            hidden, topk_ids, perm, out, k, hidden.stride(0), perm.stride(0), out.stride(0),
            TOP_K=topk_ids.shape[1], BLOCK_K=block, **pdl.options(hidden),
        )  # fmt: skip
    return out
