"""Puts a routing source (and the recorder) on every MoE layer of a built model, as each
`FusedMoE.routing`; returns the `RoutingController` the engine and the runner talk to.
With the default config (the router's own choice, no recording) nothing is installed."""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from xinfer import kernels
from xinfer.errors import UserError
from xinfer.routing.config import MODEL, REPLAY, RoutingConfig
from xinfer.routing.parametric import ParametricRouting
from xinfer.routing.recorder import RoutingRecorder
from xinfer.routing.replay import ReplayRouting
from xinfer.routing.trace import TraceHeader
from xinfer.runner.forward_context import ForwardContext, get_forward_context

logger = logging.getLogger("xinfer")


class RoutingSource(Protocol):
    """Where a layer's experts come from instead of the router (parametric.py, replay.py)."""

    def route(
        self,
        layer: int,
        router_logits: torch.Tensor,
        ctx: ForwardContext,
        top_k: int,
        renormalize: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def reset(self) -> None: ...


class LayerRouting:
    """Set as `FusedMoE.routing`: router logits (T, E) → (weights f32 (T, k), ids i32 (T, k))
    from the source (None: the router's own top-k), recorded when recording."""

    def __init__(
        self,
        index: int,
        top_k: int,
        renormalize: bool,
        source: RoutingSource | None,
        recorder: RoutingRecorder | None,
    ) -> None:
        self.index, self.top_k, self.renormalize = index, top_k, renormalize
        self.source, self.recorder = source, recorder

    def __call__(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.source is None:
            weights, ids = kernels.route_topk(router_logits, self.top_k, self.renormalize)
        else:
            ctx = get_forward_context()
            weights, ids = self.source.route(
                self.index, router_logits, ctx, self.top_k, self.renormalize
            )
        if self.recorder is not None:
            self.recorder.write(self.index, ids)
        return weights, ids


class RoutingController:
    """The installed source and recorder; the model runner's step observer."""

    def __init__(
        self, config: RoutingConfig, source: RoutingSource | None, recorder: RoutingRecorder | None
    ) -> None:
        self.config, self.source, self.recorder = config, source, recorder

    def start(self) -> None:
        """From now on (after the engine's warm-up, when request keys restart at 0) steps
        are the user's: forget the warm-up's state, record what follows."""
        if self.source is not None:
            self.source.reset()
        if self.recorder is not None:
            self.recorder.is_active = True

    def after_forward(self, request_ids: list[str], positions: list[int], qsl: list[int]) -> None:
        if self.recorder is not None:
            requests = [
                (rid, positions[qsl[b]], qsl[b + 1] - qsl[b]) for b, rid in enumerate(request_ids)
            ]
            self.recorder.after_forward(requests)

    def pass_chunk(self, ctx, request_id: str, start: int, n: int) -> None:
        if self.recorder is not None:
            self.recorder.pass_chunk(ctx, request_id, start, n)

    def end_pass(self) -> None:
        if self.recorder is not None:
            self.recorder.end_pass()

    def after_step(self) -> None:
        if self.recorder is not None:
            self.recorder.after_step()

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()


def install_routing(
    model: torch.nn.Module,
    config: RoutingConfig,
    device: torch.device,
    num_rows: int,
    max_tokens: int,
    model_name: str = "",
    is_dummy: bool = True,
) -> RoutingController | None:
    """`num_rows`: requests that can hold per-request state at once (the runner's
    `RequestSlots` capacity); `max_tokens`: the most tokens one forward carries."""
    if config.is_default:
        return None
    layers = model.moe_layers()
    if not layers:
        raise UserError("routing options apply to MoE models; this model has no routed experts")
    num_experts = [layer.num_experts for layer in layers]
    top_ks = [layer.top_k for layer in layers]
    source: RoutingSource | None = None
    if config.kind == MODEL:
        source = ParametricRouting(config.model_params, config.seed, num_experts, num_rows, device)
    elif config.kind == REPLAY:
        source = ReplayRouting(config.replay_path, num_experts, top_ks, device)
    if source is not None and not is_dummy:
        logger.warning(
            "routing source %r replaces the router's choice of experts: the output is not "
            "the model's (meant for benchmarks with --load-format dummy)",
            config.source,
        )
    recorder = None
    if config.record_path is not None:
        if len(set(top_ks)) != 1:
            raise UserError("--record-routing needs the same top-k in every MoE layer")
        header = TraceHeader(len(layers), top_ks[0], max(num_experts), model_name)
        recorder = RoutingRecorder(config.record_path, header, max_tokens, device)
    for i, layer in enumerate(layers):
        layer.routing = LayerRouting(i, layer.top_k, layer.renormalize, source, recorder)
    what = config.source if source is not None else "the router's own top-k"
    logger.info(
        "MoE routing: %s on %d layers%s",
        what,
        len(layers),
        f", recording to {config.record_path}" if recorder else "",
    )
    return RoutingController(config, source, recorder)
