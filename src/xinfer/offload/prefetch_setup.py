"""Turns cross-layer expert prefetch on for a model whose MoE layers are offloaded: picks the
predictor for the routing source (the routers themselves; the routing model's calibrated
stand-in for dummy weights), builds a `PrefetchTable` per offloaded layer and attaches the
`Prefetcher` to every OffloadExecutor. Prefetch is on by default with offload
(`OffloadConfig.prefetch_layers`); a model without a predictor (no router beside its
experts, a replayed routing trace) then runs without it, where a distance given is refused."""

from __future__ import annotations

import logging

from torch import nn

from xinfer.config import OffloadConfig
from xinfer.errors import UserError
from xinfer.layers.moe import FusedMoE
from xinfer.offload.executor import OffloadExecutor
from xinfer.offload.packed import PackedExperts
from xinfer.offload.predictor import RouterPredictor
from xinfer.offload.prefetch import Prefetcher, default_fill_programs
from xinfer.offload.prefetch_table import PrefetchTable

logger = logging.getLogger("xinfer")


def find_routers(model: nn.Module, layers: list[FusedMoE]) -> list[nn.Module]:
    """The router of each MoE layer: the `gate` beside it in its block (every MoE block of
    ours is `gate` + `experts`)."""
    routers: dict[int, nn.Module] = {}
    for module in model.modules():
        experts, gate = getattr(module, "experts", None), getattr(module, "gate", None)
        if isinstance(experts, FusedMoE) and isinstance(gate, nn.Module):
            routers[id(experts)] = gate
    missing = [i for i, layer in enumerate(layers) if id(layer) not in routers]
    if missing:
        raise UserError(
            f"MoE prefetch needs each MoE layer's router beside it; layer {missing[0]} of "
            f"this model has none: run with --moe-prefetch 0"
        )
    return [routers[id(layer)] for layer in layers]


def make_predictor(model: nn.Module, layers: list[FusedMoE], config: OffloadConfig, routing):
    """The router predictor, or the routing model's when that source routes the layers."""
    top_ks = [layer.top_k for layer in layers]
    source = getattr(routing, "source", None)
    if source is None:
        return RouterPredictor(find_routers(model, layers), top_ks, config.prefetch_cut)
    from xinfer.routing.parametric import ParametricRouting
    from xinfer.routing.predict import ModelPredictor

    if not isinstance(source, ParametricRouting):
        raise UserError(
            "MoE prefetch has no predictor for a replayed routing trace (it needs the "
            "router or the routing model): run with --moe-prefetch 0"
        )
    return ModelPredictor(
        source, top_ks, config.prefetch_cut, config.prefetch_layers, routing.config.seed
    )


def _is_packed(executors: list) -> bool:
    """The offloaded experts are packed (--moe-offload-compress on bf16 experts; the option
    leaves other dtypes and formats as they are, and their fill as plain)."""
    return any(
        isinstance(t, PackedExperts)
        for x in executors
        if x is not None
        for t in x.host_tensors.values()
    )


def install_prefetch(
    model: nn.Module, manager, config: OffloadConfig, routing, max_tokens: int
) -> Prefetcher | None:
    """Attach prefetch to `manager`'s executors (None when off or nothing is offloaded).
    `routing`: the engine's RoutingController (None: the routers route); `max_tokens`: the
    widest call that predicts (the decode batch)."""
    distance = config.prefetch_layers
    if manager is None or not distance or not manager.executors:
        return None
    layers = model.moe_layers()
    executors = [
        x if isinstance(x := layer.executor, OffloadExecutor) else None for layer in layers
    ]
    try:
        predictor = make_predictor(model, layers, config, routing)
    except UserError as e:
        if not config.prefetch_is_default:
            raise
        logger.info("MoE prefetch (on by default with offload) stays off: %s", e)
        return None
    stats = manager._stats
    tables = [
        None if x is None else PrefetchTable(x.cache, stats.prefetch_counters[i])
        for i, x in enumerate(executors)
    ]
    prefetcher = Prefetcher(
        executors, tables, predictor, distance, max_tokens, manager.device,
        fill_programs=config.prefetch_programs or default_fill_programs(_is_packed(executors)),
        issue_after_fill=config.prefetch_issue == "after-fill",
    )  # fmt: skip
    if (config.prefetch_fill or config.fill) == "copy-engine":
        prefetcher.use_copy_engine()
    for i, x in enumerate(executors):
        if x is not None:
            x.prefetch = (prefetcher, i)
    stats.prefetch = {"distance": distance, "predictor": predictor.name}
    stats.prefetcher = prefetcher
    manager.prefetcher = prefetcher
    logger.info(
        "MoE prefetch: layer l + %d's experts predicted by %s (margin %g), copied while "
        "layer l computes",
        distance,
        predictor.name,
        config.prefetch_cut,
    )
    return prefetcher
