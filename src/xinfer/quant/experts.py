"""A routed-expert layer's weights in one format: the `[E, ...]` tensor set of its two
projections (w13 = gate|up rows (2I, H), w2 = down (H, I)) and the call that runs the routed
experts on such a set, whether it holds all experts or a slot cache's `[S, ...]` copies."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xinfer import kernels
from xinfer.quant.base import TensorSpec, WeightFormat, expert_key, split_expert_set


@dataclass(frozen=True)
class ExpertWeights:
    fmt: WeightFormat
    hidden_size: int
    intermediate_size: int

    def proj_nk(self, proj: str) -> tuple[int, int]:
        """(N, K) of one expert's projection `w13` or `w2`."""
        h, i = self.hidden_size, self.intermediate_size
        return (2 * i, h) if proj == "w13" else (h, i)

    def specs(self, num_experts: int) -> dict[str, TensorSpec]:
        """Key → `[E, ...]` spec of every tensor of the set."""
        out = {}
        for proj in ("w13", "w2"):
            for name, spec in self.fmt.expert_specs(num_experts, *self.proj_nk(proj)).items():
                out[expert_key(proj, name)] = spec
        return out

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert as stored (what a slot fill moves)."""
        return sum(self.fmt.weight_bytes(*self.proj_nk(p)) for p in ("w13", "w2"))

    def __call__(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        tensors: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """hidden (T, H), topk_ids (T, k) into the first dim of `tensors`, weights float32
        (T, k) → (T, H)."""
        names = tuple(self.fmt.tensor_specs(*self.proj_nk("w2")))
        w13, w2 = split_expert_set(tensors, names)
        return kernels.format_moe(
            hidden, topk_ids, topk_weights, self.fmt, w13, w2, self.intermediate_size
        )
