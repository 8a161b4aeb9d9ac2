"""Predictors of a MoE layer's experts from an earlier layer's hidden state, for prefetch.

`RouterPredictor` is the real one: the target layer's own router applied to the hidden
state the source layer's experts receive (published: 88.6% of layer l+1's experts for a
48-layer / 128-expert model, 3.5–4 points less per further layer). Every predictor ends in
`select`: the top-k of its scores, keeping only the experts whose score beats the (k+1)-th
by more than a margin (a guess near the boundary costs bytes more often than it saves them);
the others, and padding rows of a CUDA graph, are -1 (no prediction)."""

from __future__ import annotations

import torch
from torch import nn

from xinfer.kernels import use_triton
from xinfer.runner.forward_context import ForwardContext


def select_reference(
    scores: torch.Tensor, top_k: int, margin: float, keys: torch.Tensor | None = None
) -> torch.Tensor:
    """scores (T, E) → ids (T, k) int32, descending score (ties: lowest index), -1 where the
    score does not beat the (k+1)-th by more than `margin` or the token's key is < 0."""
    scores = scores.float()
    order = torch.sort(scores, dim=-1, descending=True, stable=True)
    top_s, top_i = order.values[:, :top_k], order.indices[:, :top_k].to(torch.int32)
    if scores.shape[1] > top_k:
        bar = order.values[:, top_k : top_k + 1] + margin
    else:
        bar = torch.full_like(top_s[:, :1], -float("inf"))
    keep = top_s > bar
    if keys is not None:
        keep &= (keys >= 0)[:, None]
    return torch.where(keep, top_i, torch.full_like(top_i, -1))


def select(
    scores: torch.Tensor,
    top_k: int,
    margin: float,
    keys: torch.Tensor | None = None,
    *,
    force_triton: bool = False,
) -> torch.Tensor:
    """`select_reference` as one Triton program per token on CUDA (no host read)."""
    num_tokens, num_experts = scores.shape
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be in [1, {num_experts}]")
    if keys is not None and keys.shape != (num_tokens,):
        raise ValueError(f"keys {tuple(keys.shape)} must be ({num_tokens},)")
    if not (force_triton or use_triton(scores)):
        return select_reference(scores, top_k, margin, keys)
    import triton

    from xinfer.kernels.triton.prefetch import select_kernel

    scores = scores if scores.stride(-1) == 1 else scores.contiguous()
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=scores.device)
    if num_tokens == 0:
        return ids
    block_e = triton.next_power_of_2(num_experts)
    select_kernel[(num_tokens,)](
        scores, scores.stride(0), keys if keys is not None else ids, ids, num_experts,
        float(margin), HAS_KEYS=keys is not None, TOP_K=top_k, BLOCK_E=block_e,
        BLOCK_K=triton.next_power_of_2(top_k), num_warps=4 if block_e >= 512 else 2,
    )  # fmt: skip
    return ids


def decode_keys(ctx: ForwardContext | None, num_tokens: int) -> torch.Tensor | None:
    """Each token's request key in a decode call (token b is sequence b; -1 = padding), or
    None where the context does not say."""
    if ctx is None or ctx.request_keys is None or not ctx.is_decode:
        return None
    keys = ctx.request_keys
    return keys[:num_tokens] if keys.shape[0] >= num_tokens else None


class RouterPredictor:
    """Layer `target`'s router applied to the source layer's expert input (T, H)."""

    name = "router"
    # reads only the source layer's expert input and the router's weights: it runs on the
    # prefetch stream, its GEMV in an arrival-counter lane of its own (offload/prefetch.py)
    on_side_stream = True

    def __init__(self, routers: list[nn.Module], top_ks: list[int], margin: float) -> None:
        self.routers, self.top_ks, self.margin = routers, top_ks, margin

    def __call__(
        self, target: int, hidden: torch.Tensor, ctx: ForwardContext | None
    ) -> torch.Tensor:
        scores = self.routers[target](hidden)  # (T, E) router logits
        keys = decode_keys(ctx, hidden.shape[0])
        return select(scores, self.top_ks[target], self.margin, keys)
