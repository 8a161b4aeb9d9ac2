"""Each rank loads only its share: checkpoint tensors are narrowed (views, so only the
rank's bytes are copied) by the split their layer declares, before the loader's own shape
check; dummy weights are drawn at full size in exactly the one-rank order and narrowed the
same way, so that every TP size runs the same model from the same seed."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from tqdm import tqdm

from xinfer.errors import UserError
from xinfer.layers.linear import MergedLinear
from xinfer.parallel.group import TensorParallelGroup, current_group
from xinfer.parallel.plan import Split, tensor_splits
from xinfer.weights import dummy
from xinfer.weights.loader import named_targets
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
    t: torch.Tensor, shape: tuple[int, ...], split: Split, parts: int, group: TensorParallelGroup
) -> torch.Tensor | None:
    """Rank `group.rank`'s share of the full tensor `t`, to be copied into a tensor of
    `shape`; None when `t` cannot split into `shape` that way."""
    if split.is_first_rank_only:
        return t if group.rank == 0 else torch.zeros_like(t)
    if t.dim() != len(shape):
        return None
    dim = split.dim % t.dim()
    if t.shape[dim] % parts or shape[dim] % parts:
        return None
    local = shape[dim] // parts
    pieces = [
        _narrow_one(c, dim, local, split, group.rank, group.size) for c in t.chunk(parts, dim)
    ]
    if any(p is None for p in pieces):
        return None
    return pieces[0] if parts == 1 else torch.cat(pieces, dim)


def _split_error(name: str, t: torch.Tensor, shape: tuple, size: int) -> UserError:
    return UserError(
        f"checkpoint tensor {name!r} {tuple(t.shape)} cannot be split over {size} "
        f"tensor-parallel ranks into {tuple(shape)}; this model or format does not support "
        "--d with several devices"
    )


def rank_narrowing(
    model: nn.Module,
) -> Callable[[str, Target, torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """The loader's per-tensor hook for this rank (None without tensor parallelism)."""
    group = current_group()
    if group is None:
        return None
    splits = tensor_splits(model)

    def narrow(ckpt_name: str, target: Target, t: torch.Tensor, dst: torch.Tensor):
        split = splits.get(target.name)
        if split is None:
            if tuple(t.shape) != tuple(dst.shape):
                raise _split_error(ckpt_name, t, tuple(dst.shape), group.size)
            return t  # replicated
        parts = split.parts if target.half is None else 1  # fused [gate | up] in one tensor
        out = narrow_tensor(t, tuple(dst.shape), split, parts, group)
        if out is None:
            raise _split_error(ckpt_name, t, tuple(dst.shape), group.size)
        return out

    return narrow


@torch.no_grad()
def init_dummy_shard(
    model: nn.Module, full_model: nn.Module, seed: int, gen_device: torch.device, show: bool
) -> None:
    """`weights.dummy.init_dummy_weights` of the unsharded `full_model` (built on the meta
    device: same targets, same order, same draws), each tensor narrowed into `model`."""
    group = current_group()
    splits, local = tensor_splits(model), named_targets(model)
    gen = torch.Generator(device=gen_device).manual_seed(seed)

    def draw(shape, dtype) -> torch.Tensor:
        src = torch.empty(shape, dtype=dtype, device=gen_device)
        return src.normal_(0, dummy._STD, generator=gen)

    def put(name: str, src: torch.Tensor, dst: torch.Tensor, parts: int = 1) -> None:
        split = splits.get(name)
        out = src if split is None else narrow_tensor(src, tuple(dst.shape), split, parts, group)
        if out is None or tuple(out.shape) != tuple(dst.shape):
            raise _split_error(name, src, tuple(dst.shape), group.size)
        dst.copy_(out)

    full = named_targets(full_model)
    for name, t in tqdm(full.items(), desc="Dummy weights", disable=not show):
        dst = local[name]
        if name.endswith("norm.weight"):
            dst.fill_(1.0)
        elif t.dim() >= 3:  # (E, ...) expert stacks, one expert at a time as on one rank
            parts = splits[name].parts if name in splits else 1
            for i in range(t.shape[0]):
                put(name, draw(t.shape[1:], t.dtype), dst[i], parts)
        else:
            src = draw(t.shape, t.dtype)
            owner = full_model.get_submodule(name.rsplit(".", 1)[0])
            if not isinstance(owner, MergedLinear):
                put(name, src, dst)
                continue
            rank_owner = model.get_submodule(name.rsplit(".", 1)[0])
            for part, (start, size) in owner.shard_offsets.items():  # q|k|v, gate|up
                lstart, lsize = rank_owner.shard_offsets[part]
                put(name, src[start : start + size], dst[lstart : lstart + lsize])
