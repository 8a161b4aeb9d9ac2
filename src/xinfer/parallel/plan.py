"""What each rank holds. Layers declare how their tensors split (`tp_plan`: child or tensor
name → kind, and `tp_output = "partial"` when their output is a per-rank partial sum); this
module turns those declarations into per-tensor `Split`s, and the model's config into the
rank's config (heads and intermediate sizes divided), refusing sizes that do not divide."""

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


# Declared kind → split of each tensor of the declared module ("weight", "bias") or of the
# declared tensor itself ("" key).
KINDS: dict[str, dict[str, Split]] = {
    # output features split: weight rows (and bias) — q/k/v heads, gate/up
    "column": {"weight": Split(0), "bias": Split(0)},
    # input features split: weight columns; the output is a partial sum, the bias added once
    "row": {"weight": Split(-1), "bias": Split(0, is_first_rank_only=True)},
    # routed experts along their intermediate dim: w13 [E, 2I, H] (gate and up each), w2 [E, H, I]
    "expert_gate_up": {"": Split(-2, parts=2)},
    "expert_down": {"": Split(-1)},
    # LM head rows (vocabulary), the last rank padded
    "vocab": {"weight": Split(0, is_padded=True)},
    # an RMSNorm over a head-split projection (OLMoE's q/k norm): statistics all-reduced
    "norm_over_heads": {"weight": Split(0)},
    "norm_over_kv_heads": {"weight": Split(0)},
}


def declared_plan(module: nn.Module) -> dict[str, str]:
    plan = getattr(module, "tp_plan", None) or {}
    for name, kind in plan.items():
        if kind not in KINDS:
            raise ValueError(f"{type(module).__name__}.tp_plan[{name!r}]: unknown kind {kind!r}")
    return dict(plan)


def is_partial(module: nn.Module) -> bool:
    """The module's output is this rank's share of a sum over the ranks."""
    return getattr(module, "tp_output", None) == "partial"


def tensor_splits(model: nn.Module) -> dict[str, Split]:
    """Target name (as the loader names it) → its split; names absent are replicated."""
    splits: dict[str, Split] = {}
    for prefix, module in model.named_modules():
        for child, kind in declared_plan(module).items():
            name = f"{prefix}.{child}" if prefix else child
            for suffix, split in KINDS[kind].items():
                splits[f"{name}.{suffix}" if suffix else name] = split
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
