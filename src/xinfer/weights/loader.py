"""Fills a model's parameters and expert tensors from a stream of (checkpoint name, tensor).
Tensors of linear and expert layers go through the layer's weight format (`convert` turns
each checkpoint tensor into the format's engine tensors, into the rows of its part, which
the format's `part_views` locate); the
rest are copied as they are; once all are in, each format finishes what needs several of a
weight's tensors at once (`finish_loading`). Missing, unexpected and mis-shaped tensors are
reported in one clear error that names the checkpoint's format."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from xinfer.errors import UserError
from xinfer.quant.base import WeightFormat, expert_key, row_slice
from xinfer.weights.mapping import Target, map_name

logger = logging.getLogger("xinfer")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def named_targets(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor a checkpoint fills: parameters plus the MoE layers' expert tensors."""
    targets = dict(model.named_parameters())
    for prefix, module in model.named_modules():
        if _is_expert_layer(module):
            for key, t in module.expert_tensors.items():
                targets[f"{prefix}.{key}"] = t
    return targets


def _is_expert_layer(module: nn.Module) -> bool:
    return hasattr(module, "expert_tensors") and hasattr(module, "create_weights")


def _is_linear(module: nn.Module) -> bool:
    return hasattr(module, "weight_names") and hasattr(module, "create_weights")


@dataclass
class LoadReport:
    # target name → the parts loaded: None (whole), a merged part, or (expert, half)
    loaded: dict[str, set] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    formats: set[str] = field(default_factory=set)


def _linear_destinations(module, t: Target, name: str) -> list[tuple]:
    """[(target name, part key, format, engine tensor name → destination view, n, k)] of a
    checkpoint tensor of a linear layer (format None: the plain bias)."""
    start, rows = module.row_range(t.part)
    if t.kind == "bias":
        if module.bias is None:
            return []
        dst = module.bias[start : start + rows]
        return [(f"{name}.bias", t.part, None, {"bias": dst}, rows, module.in_features)]
    fmt: WeightFormat = module.weight_format
    part_fmt, views = fmt.part_views(
        module.weight_tensors(), module.out_features, module.in_features, start, rows,
        f"{name} part {t.part}",
    )  # fmt: skip
    return [(name, t.part, part_fmt, views, rows, module.in_features)]


def _expert_destinations(module, t: Target, name: str) -> list[tuple]:
    fmt: WeightFormat = module.expert_weights.proj_fmt(t.proj)
    n, k = module.expert_weights.proj_nk(t.proj)
    specs = fmt.tensor_specs(n, k)
    start, rows = (0, n) if t.half is None else (t.half * n // 2, n // 2)
    experts = range(module.num_experts) if t.expert is None else (t.expert,)
    out = []
    for e in experts:
        views = {
            s: row_slice(module.expert_tensors[expert_key(t.proj, s)][e], spec.n_block,
                          start, rows, f"{name} expert {e} {t.proj}")
            for s, spec in specs.items()
        }  # fmt: skip
        out.append((f"{name}.{t.proj}", e, fmt, views, rows, k))
    return out


def _copy(views: dict[str, torch.Tensor], engine: dict[str, torch.Tensor], ckpt_name: str):
    for ename, src in engine.items():
        dst = views.get(ename)
        if dst is None:
            raise ValueError(f"format produced an unknown tensor {ename!r} for {ckpt_name}")
        if tuple(dst.shape) != tuple(src.shape):
            raise UserError(
                f"checkpoint tensor {ckpt_name!r} has shape {tuple(src.shape)} but the model "
                f"expects {tuple(dst.shape)}; does config.json match the weights?"
            )
        with torch.no_grad():
            dst.copy_(src)


def _convert(fmt: WeightFormat, kind: str, tensor, n: int, k: int, ckpt_name: str) -> dict:
    try:
        return fmt.convert(kind, tensor, n, k)
    except UserError as e:  # name the checkpoint tensor in full
        raise UserError(str(e).replace(f"tensor {kind!r}", f"tensor {ckpt_name!r}", 1)) from None


def load_weights(
    model: nn.Module,
    tensors: Iterable[tuple[str, torch.Tensor]],
    renames: tuple = (),
    merged: dict[str, tuple[str, str]] | None = None,
    shard=None,
) -> LoadReport:
    """`shard` (a tensor-parallel rank's `parallel.weights.RankShard`) gives each tensor's
    share for this rank; None loads every tensor whole."""
    targets = named_targets(model)
    modules = dict(model.named_modules())
    tie = getattr(model, "lm_head", 0) is None
    report = LoadReport()
    for ckpt_name, tensor in tensors:
        if ckpt_name.endswith(_IGNORED_SUFFIXES) or (tie and ckpt_name == "lm_head.weight"):
            continue
        t = map_name(ckpt_name, renames, merged)
        module = modules.get(t.module)
        if module is not None and (_is_linear(module) or _is_expert_layer(module)):
            if t.proj is None and _is_expert_layer(module):
                report.unexpected.append(ckpt_name)
                continue
            dests = (_expert_destinations if t.proj else _linear_destinations)(module, t, t.module)
            fmt = dests[0][2] if dests else None
            if fmt is not None and t.kind not in fmt.checkpoint_names():
                report.unexpected.append(ckpt_name)
                report.formats.add(fmt.name)
                continue
            for target, key, fmt, views, n, k in dests:
                if fmt is None:  # bias: a plain tensor
                    if shard is not None:
                        tensor = shard.plain(t, tensor, tuple(views["bias"].shape), ckpt_name)
                    _copy(views, {"bias": tensor}, ckpt_name)
                    report.loaded.setdefault(target, set()).add(key)
                    continue
                src = tensor if t.proj is None or t.expert is not None else tensor[key]
                if shard is None:
                    engine = _convert(fmt, t.kind, src, n, k, ckpt_name)
                else:
                    engine = shard.convert(t, fmt, src, n, k, ckpt_name, _convert)
                got = report.loaded.setdefault(f"{target}.{t.kind}", set())
                _check_shared(fmt, views, engine, n, k, _other_parts(got, key, t), ckpt_name)
                _copy(views, engine, ckpt_name)
                if t.proj is None:
                    got.add(key)
                elif t.proj == "w13" and t.half is None:  # a fused gate|up tensor
                    got.update({(key, 0), (key, 1)})
                else:
                    got.add((key, t.half))
                report.formats.add(fmt.name)
            if not dests:
                report.unexpected.append(ckpt_name)
            continue
        if t.name not in targets:
            report.unexpected.append(ckpt_name)
            continue
        if shard is not None:
            tensor = shard.plain(t, tensor, tuple(targets[t.name].shape), ckpt_name)
        _copy({"w": targets[t.name]}, {"w": tensor}, ckpt_name)
        report.loaded.setdefault(t.name, set()).add(None)
    _check_complete(model, targets, report)
    _finish(model)
    return report


def _other_parts(got: set, key, t: Target) -> str | None:
    """The weight this tensor's part belongs to, when another of its parts (merged projection,
    expert half) already gave the same checkpoint name (None: the first)."""
    if t.proj is None:
        return t.module if any(p != key for p in got) else None
    if any(e == key and h != t.half for e, h in got):
        return f"{t.module}.{t.proj} of expert {key}"
    return None


def _check_shared(fmt, views, engine, n: int, k: int, weight: str | None, ckpt_name: str):
    """An engine tensor without an N dim (an act-order weight's `perm`) is one for every part
    of a merged weight: a later part must give the value the earlier ones gave."""
    if weight is None:
        return
    specs = fmt.tensor_specs(n, k)
    for ename, src in engine.items():
        if specs[ename].n_block is None and not torch.equal(views[ename], src.to(views[ename])):
            raise UserError(
                f"checkpoint tensor {ckpt_name!r} differs from the {ckpt_name.rsplit('.', 1)[-1]} "
                f"of the projections merged with it into {weight}; xinfer merges q/k/v and "
                "gate/up (one input) only where they share it, so this checkpoint is not supported"
            )


def _finish(model: nn.Module) -> None:
    """Each formatted layer's `finish_loading` (in place, after every tensor is in)."""
    for module in model.modules():
        if _is_linear(module):
            module.weight_format.finish_loading(
                module.weight_tensors(), module.out_features, module.in_features
            )
        elif _is_expert_layer(module):
            module.expert_weights.finish_loading(module.expert_tensors)


def _required(
    model: nn.Module, targets: dict[str, torch.Tensor], labels: dict[str, str]
) -> dict[str, set]:
    """What must arrive: name → the parts it needs. Formatted layers need every checkpoint
    tensor their format reads that produces an engine tensor, for every part (or expert
    half); `_check_complete` asks the format which checkpoint names those are."""
    need: dict[str, set] = {}
    covered: set[str] = set()
    for prefix, module in model.named_modules():
        if _is_linear(module):
            parts = set(getattr(module, "shard_offsets", None) or {None})
            for kind in module.weight_format.required_checkpoint_names():
                need[f"{prefix}.{kind}"] = parts
            if module.bias is not None:
                need[f"{prefix}.bias"] = parts
            covered |= {f"{prefix}.{n}" for n in (*module.weight_names, "bias")}
        elif _is_expert_layer(module):
            for proj, halves in (("w13", (0, 1)), ("w2", (None,))):
                fmt = module.expert_weights.proj_fmt(proj)
                every = {(e, h) for e in range(module.num_experts) for h in halves}
                for kind in fmt.required_checkpoint_names():
                    need[f"{prefix}.{proj}.{kind}"] = every
                    labels[f"{prefix}.{proj}.{kind}"] = f"{prefix}.{proj}" + (
                        "" if kind == "weight" else f".{kind}"
                    )
            covered |= {f"{prefix}.{key}" for key in module.expert_tensors}
    for name in targets:
        if name not in covered:
            need[name] = {None}
    return need


def _check_complete(model: nn.Module, targets: dict, report: LoadReport) -> None:
    missing, labels = [], {}
    for name, parts in _required(model, targets, labels).items():
        got = report.loaded.get(name, set())
        if not parts <= got:
            lacking = len(parts - got)
            what = "expert parts" if name in labels else "parts"
            label = labels.get(name, name)
            missing.append(label if parts == {None} else f"{label} ({lacking} {what})")
    quantized = sorted(f for f in report.formats if f not in ("float32", "bfloat16", "float16"))
    of_format = f" (of the {' and '.join(quantized)} format)" if quantized else ""
    odd = any(not n.endswith((".weight", ".bias")) for n in report.unexpected)
    hint = "; does config.json's quantization_config match the weights?" if quantized or odd else ""
    if report.unexpected:
        shown = ", ".join(report.unexpected[:5])
        more = f" and {len(report.unexpected) - 5} more" if len(report.unexpected) > 5 else ""
        raise UserError(
            f"checkpoint has tensors this model does not use{of_format}: {shown}{more}{hint}"
        )
    if missing:
        shown = ", ".join(missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise UserError(f"checkpoint is missing tensors{of_format}: {shown}{more}{hint}")
