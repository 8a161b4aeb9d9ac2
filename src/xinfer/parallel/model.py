"""The tensor-parallel wrapper of a model class: `rank_model_class(cls)` subclasses it
(no fork of the model file) so that each rank's instance, built from its rank config, sums
the partial outputs its layers declare (one all-reduce after attention, one after each MLP
or MoE block), normalises head-split projections with all-reduced statistics, and computes
its share of the vocabulary's logits, gathered on every rank."""

from __future__ import annotations

import torch
from torch import nn

from xinfer.layers.linear import Linear
from xinfer.layers.norm import RMSNorm
from xinfer.parallel.group import TensorParallelGroup, current_group
from xinfer.parallel.plan import declared_plan, reduction_points


class ShardedRMSNorm(nn.Module):
    """RMSNorm over features split across the ranks (OLMoE's q/k norm over all heads): the
    sum of squares is all-reduced; `replicas` ranks hold each feature (KV heads replicated)."""

    def __init__(
        self, norm: RMSNorm, full_size: int, replicas: int, group: TensorParallelGroup
    ) -> None:
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps
        self.full_size, self.replicas, self.group = full_size, replicas, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        sum_sq = self.group.all_reduce(xf.pow(2).sum(-1, keepdim=True))
        var = sum_sq / (self.full_size * self.replicas)
        return self.weight * (xf * torch.rsqrt(var + self.eps)).to(x.dtype)


def _all_reduce_hook(group: TensorParallelGroup):
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return group.all_reduce(output)

    return hook


class TensorParallelMixin:
    """Mixed in before a model class: same constructor, same forward, sharded."""

    tp_group: TensorParallelGroup

    def __init__(self, cfg, max_pos: int, expert_device=None) -> None:
        super().__init__(cfg, max_pos, expert_device)
        group = current_group()
        if group is None:
            raise RuntimeError("a tensor-parallel model is built only inside a TP group")
        self.tp_group = group
        self._vocab_heads: list[str] = []
        for module in list(self.modules()):
            for child, kind in declared_plan(module).items():
                if kind == "vocab" and getattr(module, child) is not None:
                    self._shard_vocab(module, child, cfg.vocab_size)
                elif kind in ("norm_over_heads", "norm_over_kv_heads"):
                    self._shard_norm(module, child, kind == "norm_over_kv_heads")
        for module in reduction_points(self):
            module.register_forward_hook(_all_reduce_hook(group))

    def _shard_vocab(self, module: nn.Module, child: str, vocab_size: int) -> None:
        old = getattr(module, child)
        rows = -(-vocab_size // self.tp_group.size)
        setattr(module, child, Linear(old.in_features, rows))
        self.vocab_size, self.vocab_rows = vocab_size, rows
        self._vocab_heads.append(child)

    def _shard_norm(self, module: nn.Module, child: str, is_kv: bool) -> None:
        norm, full = getattr(module, child), self.tp_group.full_config
        if is_kv:  # KV heads: replicated on size / num_kv_heads ranks when fewer than ranks
            full_size = full.num_kv_heads * full.head_dim
            replicas = max(1, self.tp_group.size // full.num_kv_heads)
        else:
            full_size, replicas = full.num_heads * full.head_dim, 1
        setattr(module, child, ShardedRMSNorm(norm, full_size, replicas, self.tp_group))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each rank's vocabulary rows, gathered: (T, V) float32 on every rank. A model whose
        LM head is its (replicated) embedding computes all rows on every rank instead."""
        logits = super().compute_logits(hidden)
        if not self._vocab_heads:
            return logits
        if logits.shape[-1] != self.vocab_rows:
            raise RuntimeError("the vocabulary-parallel LM head was not used by compute_logits")
        gathered = self.tp_group.all_gather_columns(logits)
        return gathered[:, : self.vocab_size]


_CLASSES: dict[type, type] = {}


def rank_model_class(cls: type) -> type:
    """`cls` itself without tensor parallelism; else its tensor-parallel subclass."""
    if current_group() is None:
        return cls
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"TensorParallel{cls.__name__}", (TensorParallelMixin, cls), {})
    return _CLASSES[cls]
