"""Fills a model's parameters and expert tensors from a stream of (checkpoint name, tensor),
tracking which parts of each target arrived so that missing, unexpected and mis-shaped
tensors are reported in one clear error."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from xinfer.errors import UserError
from xinfer.layers.linear import MergedLinear
from xinfer.layers.moe import FusedMoE
from xinfer.weights.mapping import Target, map_name

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def named_targets(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor a checkpoint fills: parameters plus the MoE layers' expert tensors."""
    targets = dict(model.named_parameters())
    for prefix, module in model.named_modules():
        if isinstance(module, FusedMoE):
            for key, t in module.expert_tensors.items():
                targets[f"{prefix}.{key}"] = t
    return targets


def _expected_parts(model: nn.Module, targets: dict[str, torch.Tensor]) -> dict[str, set]:
    """Parts each target needs before it counts as loaded."""
    parts: dict[str, set] = {name: {None} for name in targets}
    for prefix, module in model.named_modules():
        if isinstance(module, MergedLinear):
            for kind in ("weight", "bias"):
                if f"{prefix}.{kind}" in parts:
                    parts[f"{prefix}.{kind}"] = set(module.shard_offsets)
    return parts


@dataclass
class LoadReport:
    loaded: dict[str, set] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)


def _slice(model: nn.Module, dst: torch.Tensor, name: str, t: Target) -> torch.Tensor:
    if t.part is not None:
        merged = model.get_submodule(name.rsplit(".", 1)[0])
        start, size = merged.shard_offsets[t.part]
        return dst[start : start + size]
    if t.expert is not None:
        dst = dst[t.expert]
        if t.half is not None:
            rows = dst.shape[0] // 2
            dst = dst[t.half * rows : (t.half + 1) * rows]
    return dst


def load_weights(
    model: nn.Module,
    tensors: Iterable[tuple[str, torch.Tensor]],
    renames: tuple = (),
    shard: Callable[[str, Target, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> LoadReport:
    """`shard(name, target, tensor, dst)`: a tensor-parallel rank's share of `tensor`."""
    targets = named_targets(model)
    tie = getattr(model, "lm_head", 0) is None
    report = LoadReport()
    num_experts: dict[str, int] = {}
    for ckpt_name, tensor in tensors:
        if ckpt_name.endswith(_IGNORED_SUFFIXES) or (tie and ckpt_name == "lm_head.weight"):
            continue
        t = map_name(ckpt_name, renames)
        if t.name not in targets:
            report.unexpected.append(ckpt_name)
            continue
        dst = _slice(model, targets[t.name], t.name, t)
        if shard is not None:
            tensor = shard(ckpt_name, t, tensor, dst)
        if tuple(dst.shape) != tuple(tensor.shape):
            raise UserError(
                f"checkpoint tensor {ckpt_name!r} has shape {tuple(tensor.shape)} but the model "
                f"expects {tuple(dst.shape)}; does config.json match the weights?"
            )
        with torch.no_grad():
            dst.copy_(tensor)
        key = t.part if t.expert is None else (t.expert, t.half)
        report.loaded.setdefault(t.name, set()).add(key)
        if t.expert is not None:
            num_experts[t.name] = targets[t.name].shape[0]
    _check_complete(model, targets, report, num_experts)
    return report


def _check_complete(
    model: nn.Module, targets: dict, report: LoadReport, num_experts: dict[str, int]
) -> None:
    expected = _expected_parts(model, targets)
    missing = []
    for name in targets:
        got = report.loaded.get(name, set())
        if name in num_experts:  # stacked per expert: every (expert, half) must be there
            halves = (0, 1) if name.endswith("w13") else (None,)
            need = {(e, h) for e in range(num_experts[name]) for h in halves}
            if not need <= got:
                missing.append(f"{name} ({len(need - got)} expert parts)")
        elif not expected[name] <= got:
            missing.append(name)
    if report.unexpected:
        shown = ", ".join(report.unexpected[:5])
        more = f" and {len(report.unexpected) - 5} more" if len(report.unexpected) > 5 else ""
        raise UserError(f"checkpoint has tensors this model does not use: {shown}{more}")
    if missing:
        shown = ", ".join(missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise UserError(f"checkpoint is missing tensors: {shown}{more}")
