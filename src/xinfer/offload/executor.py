"""Expert executors: the strategy that runs a MoE layer's routed experts. `ResidentExecutor`
keeps the full `[E, ...]` set where the model runs; `OffloadExecutor` (offload/) keeps a slot
cache. Both call the same `kernels.fused_moe`, which never knows which one it serves."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from xinfer import kernels


class ExpertExecutor(ABC):
    @abstractmethod
    def __call__(
        self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        """hidden (T, H), topk_ids int32 (T, k) expert ids, topk_weights float32 (T, k)."""


class ResidentExecutor(ExpertExecutor):
    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def __call__(
        self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        t = self.tensors
        return kernels.fused_moe(hidden, topk_ids, topk_weights, t["w13"], t["w2"])
