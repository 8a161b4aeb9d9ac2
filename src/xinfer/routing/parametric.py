"""The routing model as a routing source: per MoE layer l, the experts of a token are the
top-k of `s_l·(σ·z[l] + τ·c[l](t)) + Gumbel`, with z fixed per layer (from the seed) and c a
per-request AR(1) drift that starts fresh with each request and advances once per token
(prompt tokens included). Per-request state lives in device tensors indexed by the forward
context's state rows; nothing runs on the host per step (see parametric_ops.py)."""

from __future__ import annotations

from dataclasses import replace

import torch

from xinfer.routing import noise
from xinfer.routing.batch import sequence_batch
from xinfer.routing.config import RoutingModelParams
from xinfer.routing.parametric_ops import (
    LayerConstants,
    RoutingState,
    advance_state,
    layer_constants,
    select_experts,
)
from xinfer.runner.forward_context import ForwardContext

POPULARITY = 4  # hash stream that seeds each layer's z


def popularity_draw(seed: int, layer: int, num_experts: int) -> torch.Tensor:
    """z[l] ~ N(0, 1)^E, fixed by (seed, layer)."""
    gen = torch.Generator().manual_seed(noise.layer_base(seed, POPULARITY, layer))
    return torch.randn(num_experts, generator=gen)


class ParametricRouting:
    def __init__(
        self,
        params: RoutingModelParams,
        seed: int,
        num_experts: list[int],
        num_rows: int,
        device: torch.device,
    ) -> None:
        """`num_experts[l]` of every MoE layer l (in model order); `num_rows` requests can
        hold state at once (plus one scratch row)."""
        self.params = params
        self.constants: list[LayerConstants] = []
        self.states: list[RoutingState] = []
        for layer, e in enumerate(num_experts):
            z = popularity_draw(seed, layer, e)
            const = layer_constants(
                seed, layer, params.layer_scale(layer), params.sigma, params.tau, params.phi, z
            )
            self.constants.append(replace(const, popularity=const.popularity.to(device)))
            self.states.append(RoutingState.empty(num_rows, e, device))
        # `before_advance(layer)`, where set, runs before a layer's state advances: the
        # prefetch predictor (routing/predict.py) reads that state from another stream and
        # makes the advance wait until it has
        self.before_advance = None

    def reset(self) -> None:
        """Forget every request's drift (the engine's warm-up requests, before the user's)."""
        for state in self.states:
            state.pos.fill_(-1)
            state.key.fill_(-1)

    def route(
        self,
        layer: int,
        router_logits: torch.Tensor,
        ctx: ForwardContext,
        top_k: int,
        renormalize: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """→ (weights float32 (T, k), ids int32 (T, k))."""
        const = self.constants[layer]
        if self.before_advance is not None:
            self.before_advance(layer)
        c, keys, positions = advance_state(
            self.states[layer], sequence_batch(ctx), const, router_logits.shape[0]
        )
        return select_experts(c, keys, positions, router_logits, const, top_k, renormalize)
