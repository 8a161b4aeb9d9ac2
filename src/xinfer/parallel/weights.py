"""Each rank loads only its share. A checkpoint tensor of a sharded layer is converted by its
weight format at full size (N, K), then each engine tensor is narrowed along N (column) or K
(row) in the units its `TensorSpec` declares (`n_block` rows, `k_block` columns), so every
format splits the same way and a split that cuts a block is refused. Dummy weights are drawn
at full size in exactly the one-rank order and narrowed alike, so that every TP size runs the
same model from the same seed."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from tqdm import tqdm

from xinfer.errors import UserError
from xinfer.parallel.group import TensorParallelGroup, current_group
from xinfer.parallel.plan import Split, module_splits
from xinfer.quant.base import WeightFormat, expert_key
from xinfer.weights import dummy
from xinfer.weights.mapping import Target


def _narrow_one(t: torch.Tensor, dim: int, local: int, split: Split, rank: int, size: int):
    full = t.shape[dim]
    if split.is_padded:  # rows [rank*local, ...) that exist, then zeros up to `local`
        start = min(full, rank * local)
        piece = t.narrow(dim, start, min(local, full - start))
        if piece.shape[dim] == local:
            return piece
        shape = list(t.shape)
        shape[dim] = local - piece.shape[dim]
        return torch.cat([piece, t.new_zeros(shape)], dim)
    if full == local * size:
        return t.narrow(dim, rank * local, local)
    units = full // local if local else 0
    if units and full % local == 0 and size % units == 0:  # fewer units (KV heads) than ranks
        return t.narrow(dim, rank * units // size * local, local)
    return None


def narrow_tensor(
    t: torch.Tensor, shape: tuple[int, ...], split: Split, group: TensorParallelGroup
) -> torch.Tensor | None:
    """Rank `group.rank`'s share of the full tensor `t`, to be copied into a tensor of
    `shape`; None when `t` cannot split into `shape` that way."""
    if split.is_first_rank_only:
        return t if group.rank == 0 else torch.zeros_like(t)
    if t.dim() != len(shape):
        return None
    dim, parts = split.dim % t.dim(), split.parts
    if t.shape[dim] % parts or shape[dim] % parts:
        return None
    local = shape[dim] // parts
    pieces = [
        _narrow_one(c, dim, local, split, group.rank, group.size) for c in t.chunk(parts, dim)
    ]
    if any(p is None for p in pieces):
        return None
    return pieces[0] if parts == 1 else torch.cat(pieces, dim)


def _refuse(name: str, what: str, size: int) -> UserError:
    return UserError(
        f"{name} cannot be split over {size} tensor-parallel ranks ({what}); use a number of "
        "devices (--d) that divides it, or one device"
    )


class RankShard:
    """The loader's hook: this rank's share of each checkpoint tensor. `full_model` is the
    unsharded model on the meta device (its modules' full N and K)."""

    def __init__(self, model: nn.Module, full_model: nn.Module, group: TensorParallelGroup):
        self.kinds, self.group = module_splits(model), group
        self.full = dict(full_model.named_modules())
        self._check_declared(model)

    def _check_declared(self, model: nn.Module) -> None:
        """A layer that the rank's config resized must declare how it splits; otherwise
        this model is refused (a guess could compute garbage)."""
        for name, mod in model.named_modules():
            full = self.full.get(name)
            if full is None:
                continue
            if _is_linear(mod):
                resized = (mod.out_features, mod.in_features) != (
                    full.out_features,
                    full.in_features,
                )
                declared = name in self.kinds
            elif _is_expert_layer(mod):
                resized = mod.intermediate_size != full.intermediate_size
                declared = f"{name}.w13" in self.kinds and f"{name}.w2" in self.kinds
            else:
                shapes = [
                    {n: tuple(p.shape) for n, p in m.named_parameters(recurse=False)}
                    for m in (mod, full)
                ]
                resized, declared = shapes[0] != shapes[1], name in self.kinds
            if resized and not declared:
                arch = getattr(getattr(model, "config", None), "architecture", type(model).__name__)
                raise UserError(
                    f"tensor parallelism does not support {arch} yet: its layer {name} "
                    f"({type(mod).__name__}) declares no split; run it on one device"
                )

    def kind(self, t: Target) -> str | None:
        return self.kinds.get(f"{t.module}.{t.proj}" if t.proj else t.module)

    def full_nk(self, t: Target) -> tuple[int, int]:
        full = self.full[t.module]
        if t.proj is not None:  # an expert projection, or one half of w13
            n, k = full.expert_weights.proj_nk(t.proj)
            return (n if t.half is None else n // 2), k
        return full.row_range(t.part)[1], full.in_features

    def convert(
        self,
        t: Target,
        fmt: WeightFormat,
        tensor: torch.Tensor,
        n: int,
        k: int,
        name: str,
        convert: Callable,
    ) -> dict[str, torch.Tensor]:
        """The loader's `convert(fmt, kind, tensor, n, k, name)` for this rank's (n, k)
        share of a checkpoint tensor: converted at full size, then narrowed."""
        kind = self.kind(t)
        if kind is None:
            return convert(fmt, t.kind, tensor, n, k, name)
        n_full, k_full = self.full_nk(t)
        parts = 2 if t.proj == "w13" and t.half is None else 1  # fused [gate | up]
        engine = convert(fmt, t.kind, tensor, n_full, k_full, name)
        return self.narrow_engine(fmt, engine, kind, n, k, parts, name)

    def narrow_engine(
        self,
        fmt: WeightFormat,
        engine: dict[str, torch.Tensor],
        kind: str,
        n: int,
        k: int,
        parts: int,
        name: str,
    ) -> dict[str, torch.Tensor]:
        """Full-size engine tensors → this rank's, shaped as `fmt.tensor_specs(n, k)`."""
        specs, out = fmt.tensor_specs(n, k), {}
        for tensor_name, t in engine.items():
            spec = specs[tensor_name]
            if kind == "row":
                dim = -1 if spec.k_block else None
            else:
                dim = 0 if spec.n_block else None
            if dim is None:  # no N (or K) dim: the same on every rank
                out[tensor_name] = t
                continue
            split = Split(dim, parts, is_padded=kind == "vocab")
            narrowed = narrow_tensor(t, spec.shape, split, self.group)
            if narrowed is None:
                blocks = f"its {fmt.name} format stores blocks of {spec.n_block or 1} x "
                blocks += f"{spec.k_block or 1}; {tuple(t.shape)} into {tuple(spec.shape)}"
                raise _refuse(f"{name} ({tensor_name})", blocks, self.group.size)
            out[tensor_name] = narrowed
        return out

    def plain(self, t: Target, tensor: torch.Tensor, shape: tuple[int, ...], name: str):
        """A tensor without a weight format (a bias, a norm weight, the embedding)."""
        kind = self.kind(t)
        if kind is None:
            if tuple(tensor.shape) != tuple(shape):
                raise _refuse(name, f"{tuple(tensor.shape)} into {tuple(shape)}", self.group.size)
            return tensor
        split = Split(0, is_first_rank_only=kind == "row", is_padded=kind == "vocab")
        narrowed = narrow_tensor(tensor, tuple(shape), split, self.group)
        if narrowed is None:
            raise _refuse(name, f"{tuple(tensor.shape)} into {tuple(shape)}", self.group.size)
        return narrowed


def rank_shard(model: nn.Module, full_model_fn) -> RankShard | None:
    """The loader's hook for this rank (None without tensor parallelism)."""
    group = current_group()
    return None if group is None else RankShard(model, full_model_fn(), group)


def _copy(dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
    for name, t in src.items():
        dst[name].copy_(t)


def _is_expert_layer(module: nn.Module) -> bool:
    return hasattr(module, "expert_tensors") and hasattr(module, "create_weights")


def _is_linear(module: nn.Module) -> bool:
    return hasattr(module, "weight_names") and hasattr(module, "create_weights")


@torch.no_grad()
def init_dummy_shard(
    model: nn.Module, shard: RankShard, full_model: nn.Module, seed: int, gen_device, show: bool
) -> None:
    """`weights.dummy.init_dummy_weights` of the unsharded `full_model` (meta: same modules,
    same order, same draws), every tensor narrowed into this rank's `model`."""
    gen = torch.Generator(device=gen_device).manual_seed(seed)
    local = dict(model.named_modules())
    formatted: set[str] = set()
    modules = list(full_model.named_modules())
    for prefix, full in tqdm(modules, desc="Dummy weights", disable=not show):
        mod = local[prefix]
        if _is_expert_layer(full):
            fmt = mod.weight_format
            for e in range(full.num_experts):
                for proj in ("w13", "w2"):
                    n, k = full.expert_weights.proj_nk(proj)
                    tensors = fmt.dummy(n, k, gen, dummy._STD)
                    kind = shard.kinds.get(f"{prefix}.{proj}")
                    if kind is not None:
                        parts = 2 if proj == "w13" else 1
                        ln, lk = mod.expert_weights.proj_nk(proj)
                        tensors = shard.narrow_engine(fmt, tensors, kind, ln, lk, parts, prefix)
                    dst = {n: mod.expert_tensors[expert_key(proj, n)][e] for n in tensors}
                    _copy(dst, tensors)
        elif _is_linear(full):
            fmt = mod.weight_format
            tensors = fmt.dummy(full.out_features, full.in_features, gen, dummy._STD)
            _dummy_linear(shard, mod, full, fmt, tensors, prefix)
            formatted.add(prefix)
    for name, t in full_model.named_parameters():
        owner, _, kind = name.rpartition(".")
        if owner in formatted and kind != "bias":
            continue
        dst = model.get_parameter(name)
        if name.endswith("norm.weight"):
            dst.fill_(1.0)
            continue
        src = torch.empty(t.shape, dtype=t.dtype, device=gen_device)
        src.normal_(0, dummy._STD, generator=gen)
        full_owner = full_model.get_submodule(owner) if owner else full_model
        if kind == "bias" and getattr(full_owner, "shard_offsets", None):
            for part, (start, rows) in full_owner.shard_offsets.items():  # q|k|v: each alone
                lstart, lrows = local[owner].row_range(part)
                piece, part_dst = src[start : start + rows], dst[lstart : lstart + lrows]
                target = Target(owner, kind, part=part)
                part_dst.copy_(shard.plain(target, piece, tuple(part_dst.shape), name))
        else:
            dst.copy_(shard.plain(Target(owner, kind), src, tuple(dst.shape), name))


def _parts(linear) -> list[tuple[str | None, tuple[int, int]]]:
    """A linear's (part, (first row, rows)) of its N dim: each merged part, or the whole."""
    offsets = getattr(linear, "shard_offsets", None)
    return list(offsets.items()) if offsets else [(None, (0, linear.out_features))]


def _dummy_linear(shard: RankShard, mod, full, fmt: WeightFormat, tensors: dict, prefix: str):
    """A full-size linear's engine tensors into this rank's: part by part for merged ones."""
    kind = shard.kinds.get(prefix)
    if kind is None:
        _copy(mod.weight_tensors(), tensors)
        return
    full_specs = fmt.tensor_specs(full.out_features, full.in_features)
    local_specs = fmt.tensor_specs(mod.out_features, mod.in_features)
    for part, (start, rows) in _parts(full):
        lstart, lrows = mod.row_range(part)
        piece, dst = {}, {}
        for name, t in tensors.items():
            nb = full_specs[name].n_block
            piece[name] = t if nb is None else t[start // nb : (start + rows) // nb]
            lnb = local_specs[name].n_block
            d = getattr(mod, name)
            dst[name] = d if lnb is None else d[lstart // lnb : (lstart + lrows) // lnb]
        _copy(dst, shard.narrow_engine(fmt, piece, kind, lrows, mod.in_features, 1, prefix))
