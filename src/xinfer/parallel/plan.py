"""What each rank holds. Layers declare how their children split (`tp_plan`: child name, or
an expert layer's projection → kind) and `tp_output = "partial"` when their output is a
per-rank partial sum; this module collects those declarations and turns the model's config
into the rank's config (heads and intermediate sizes divided), refusing what does not divide."""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from xinfer.config import ModelConfig
from xinfer.errors import UserError


@dataclass(frozen=True)
class Split:
    """How a checkpoint tensor narrows to a rank: along `dim`, in `parts` equal parts that
    each split alike ([gate | up] stacked); `is_first_rank_only` for a row-parallel bias
    (added once: the other ranks hold zeros); `is_padded` when the last rank may be short
    (vocabulary rows)."""

    dim: int
    parts: int = 1
    is_first_rank_only: bool = False
    is_padded: bool = False


# What a layer may declare for a child module (or, for an expert layer, a projection):
#   column  output features (N) split: weight rows, bias rows — q/k/v heads, gate/up, w13
#   row     input features (K) split: weight columns; the output is a partial sum and the
#           bias is added once (rank 0) — o_proj, down, w2
#   vocab   the LM head's rows, the last rank padded with zero rows
#   norm_over_heads / norm_over_kv_heads   an RMSNorm over a head-split projection (OLMoE's
#           q/k norm): weight split like the heads, statistics all-reduced
KINDS = ("column", "row", "vocab", "norm_over_heads", "norm_over_kv_heads")


def declared_plan(module: nn.Module) -> dict[str, str]:
    plan = getattr(module, "tp_plan", None) or {}
    for name, kind in plan.items():
        if kind not in KINDS:
            raise ValueError(f"{type(module).__name__}.tp_plan[{name!r}]: unknown kind {kind!r}")
    return dict(plan)


def is_partial(module: nn.Module) -> bool:
    """The module's output is this rank's share of a sum over the ranks."""
    return getattr(module, "tp_output", None) == "partial"


def module_splits(model: nn.Module) -> dict[str, str]:
    """Module name (an expert layer's projections: `<name>.w13`, `<name>.w2`) → declared
    kind; a module absent is replicated."""
    splits: dict[str, str] = {}
    for prefix, module in model.named_modules():
        for child, kind in declared_plan(module).items():
            splits[f"{prefix}.{child}" if prefix else child] = kind
    return splits


def reduction_points(model: nn.Module) -> list[nn.Module]:
    """Modules whose partial output is summed over the ranks: the outermost partial ones
    (attention, an MLP, a MoE block with its shared expert folded in)."""
    points = []
    for _, module in model.named_modules():
        children = list(module.children())
        if is_partial(module):
            continue  # its partial children are summed with it, once
        points += [c for c in children if is_partial(c)]
    return points


def _divide(what: str, value: int, size: int, fix: str) -> int:
    if value % size:
        raise UserError(
            f"tensor parallelism over {size} ranks needs {what} ({value}) to divide evenly; {fix}"
        )
    return value // size


def rank_config(cfg: ModelConfig, size: int) -> ModelConfig:
    """The config a rank builds: its share of the attention heads and of every intermediate
    size; KV heads split too, or replicated when there are fewer than ranks."""
    fix = "use a number of devices (--d) that divides it"
    heads = _divide("the number of attention heads", cfg.num_heads, size, fix)
    kv = cfg.num_kv_heads
    if kv >= size:
        kv_heads = _divide("the number of KV heads", kv, size, fix)
    elif size % kv:
        raise UserError(
            f"tensor parallelism over {size} ranks cannot share {kv} KV heads: the number of "
            "ranks must divide them or be a multiple of them"
        )
    else:
        kv_heads = 1  # each KV head replicated on size / kv ranks
    fields: dict = {"num_heads": heads, "num_kv_heads": kv_heads}
    if any(not cfg.is_moe_layer(i) for i in range(cfg.num_layers)):
        fields["intermediate_size"] = _divide(
            "the dense MLP intermediate size", cfg.intermediate_size, size, fix
        )
    if cfg.is_moe:
        fields["moe_intermediate_size"] = _divide(
            "the experts' intermediate size", cfg.moe_intermediate_size, size, fix
        )
    if cfg.shared_expert_intermediate_size:
        fields["shared_expert_intermediate_size"] = _divide(
            "the shared expert's intermediate size", cfg.shared_expert_intermediate_size, size, fix
        )
    return replace(cfg, **fields)
