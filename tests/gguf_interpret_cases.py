"""Shared pieces of the GGUF kernels' interpreter tests (`tests/kernels/test_gguf_*_interpret.py`):
the launcher with its kernels checked to run interpreted, random valid block rows, a small
MoE case in any pair of block types, and the tolerance against the twin scaled to the
largest output."""

from __future__ import annotations

import gguf_files as gf
import torch
from interpreter_child import require_interpreted


def interpreted_gguf_launch():
    """`kernels.gguf_launch`, failing unless its kernels run under the interpreter."""
    from xinfer.kernels import gguf_launch
    from xinfer.kernels.triton import gguf_gemm

    require_interpreted(gguf_gemm.gguf_linear_kernel)
    return gguf_launch


def block_rows(name: str, rows: int, k: int, seed: int, experts: int | None = None) -> torch.Tensor:
    return gf.random_block_rows(name, rows, k, seed, experts)


def assert_close_scaled(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Equal to within `tol` of the largest output (fp16: the twin rounds the weights)."""
    tol = 1e-5 if dtype == torch.float32 else 3e-3
    scale = ref.float().abs().max()
    torch.testing.assert_close(out.float() / scale, ref.float() / scale, rtol=0, atol=tol)


def moe_case(
    t13: str, t2: str, seed: int, num_experts: int = 4, hidden_dim: int = 256, inter: int = 0
):
    """hidden_dim 256 (one super-block, or 8 legacy blocks) by default; inter 256 for K-quant
    w2, else 96 (a partial last chunk for 32-blocks)."""
    from xinfer.kernels import reference

    inter = inter or (256 if t2.endswith("_K") else 96)
    w13 = block_rows(t13, 2 * inter, hidden_dim, seed, experts=num_experts)
    w2 = block_rows(t2, hidden_dim, inter, seed + 1, experts=num_experts)
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, hidden_dim, generator=g) * 0.05
    weights, ids = reference.route_topk(torch.randn(3, num_experts, generator=g), 2, True)
    return hidden, ids, weights, w13, w2, inter
