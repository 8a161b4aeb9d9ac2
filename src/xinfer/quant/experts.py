"""A routed-expert layer's weights in one format: the `[E, ...]` tensor set of its two
projections (w13 = gate|up rows (2I, H), w2 = down (H, I)) and the call that runs the routed
experts on such a set, whether it holds all experts or a slot cache's `[S, ...]` copies.
The two projections may be stored in different formats (`w2_fmt`: GGUF files often keep
ffn_down in a wider block type than gate/up); the w13 format then runs both."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xinfer import kernels
from xinfer.quant.base import TensorSpec, WeightFormat, expert_key


@dataclass(frozen=True)
class ExpertWeights:
    fmt: WeightFormat
    hidden_size: int
    intermediate_size: int
    w2_fmt: WeightFormat | None = None  # None: the same as `fmt`

    def proj_fmt(self, proj: str) -> WeightFormat:
        """The format of projection `w13` or `w2`."""
        return self.w2_fmt if proj == "w2" and self.w2_fmt is not None else self.fmt

    def proj_nk(self, proj: str) -> tuple[int, int]:
        """(N, K) of one expert's projection `w13` or `w2`."""
        h, i = self.hidden_size, self.intermediate_size
        return (2 * i, h) if proj == "w13" else (h, i)

    def specs(self, num_experts: int) -> dict[str, TensorSpec]:
        """Key → `[E, ...]` spec of every tensor of the set."""
        out = {}
        for proj in ("w13", "w2"):
            fmt = self.proj_fmt(proj)
            for name, spec in fmt.expert_specs(num_experts, *self.proj_nk(proj)).items():
                out[expert_key(proj, name)] = spec
        return out

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert as stored (what a slot fill moves)."""
        return sum(self.proj_fmt(p).weight_bytes(*self.proj_nk(p)) for p in ("w13", "w2"))

    def finish_loading(self, tensors: dict[str, torch.Tensor]) -> None:
        """The format's `finish_experts` on the loaded `[E, ...]` set, in place (a pair of
        formats, as GGUF's, converts each tensor on its own: nothing to finish)."""
        if self.w2_fmt not in (None, self.fmt):
            return
        w13 = _proj_set(tensors, "w13", self.fmt.tensor_specs(*self.proj_nk("w13")))
        w2 = _proj_set(tensors, "w2", self.fmt.tensor_specs(*self.proj_nk("w2")))
        self.fmt.finish_experts(w13, w2, self.hidden_size, self.intermediate_size)

    def __call__(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        tensors: dict[str, torch.Tensor],
        max_ids: int | None = None,
    ) -> torch.Tensor:
        """hidden (T, H), topk_ids (T, k) into the first dim of `tensors`, weights float32
        (T, k) → (T, H). `max_ids`: at most this many distinct ids in `topk_ids` (an
        offloaded layer's E on its slot view; None: any row of `tensors`)."""
        w13 = _proj_set(tensors, "w13", self.fmt.tensor_specs(*self.proj_nk("w13")))
        w2 = _proj_set(tensors, "w2", self.proj_fmt("w2").tensor_specs(*self.proj_nk("w2")))
        w2_fmt = self.w2_fmt if self.w2_fmt not in (None, self.fmt) else None
        return kernels.format_moe(
            hidden, topk_ids, topk_weights, self.fmt, w13, w2, self.intermediate_size, w2_fmt,
            max_ids,
        )  # fmt: skip


def _proj_set(tensors: dict[str, torch.Tensor], proj: str, names) -> dict[str, torch.Tensor]:
    return {n: tensors[expert_key(proj, n)] for n in names}
