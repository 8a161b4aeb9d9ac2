"""The routed-expert layer: router logits → top-k → an ExpertExecutor. The layer creates the
`[E, ...]` expert tensor set of its weight format (plain `w13`/`w2`, or packed weights with
their scales) and owns it only until the engine hands it to an executor (resident or
offloaded); it never knows where the experts live."""

from __future__ import annotations

import torch
from torch import nn

from xinfer import kernels
from xinfer.host_memory import host_empty
from xinfer.layers.linear import Linear
from xinfer.offload.executor import ExpertExecutor, ResidentExecutor
from xinfer.quant.assign import is_deferred
from xinfer.quant.base import WeightFormat
from xinfer.quant.experts import ExpertWeights
from xinfer.quant.unquantized import Unquantized
from xinfer.weights.mapping import expert_module_names


class FusedMoE(nn.Module):
    """Expert tensors (plain format): `w13` (E, 2I, H) = [gate | up] rows, `w2` (E, H, I);
    a quantized format adds its tensors per projection (`w13_<name>`, `w2_<name>`)."""

    is_quantizable = True

    # Tensor parallel: every rank holds a slice of every expert's intermediate dim (w13's
    # rows, each of its gate and up halves; w2's columns).
    tp_plan = {"w13": "column", "w2": "row"}
    tp_output = "partial"

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool,
        expert_device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.expert_device = torch.device(expert_device or torch.get_default_device())
        # Plain tensors, not parameters: they may live on the host while the model is on GPU.
        self.expert_tensors: dict[str, torch.Tensor] = {}
        self.expert_weights: ExpertWeights | None = None
        self.executor: ExpertExecutor | None = None
        # Set by xinfer.routing (explicit options only): another source of the top-k choice
        # (a routing model, a replayed trace) and/or the recording of the routed ids.
        self.routing = None
        if not is_deferred():
            self.create_weights(Unquantized(torch.get_default_dtype()))

    def create_weights(self, fmt: WeightFormat, w2_fmt: WeightFormat | None = None) -> None:
        """Create the `[E, ...]` tensor set of `fmt` (w2 in `w2_fmt` when given) on the expert
        device (uninitialised)."""
        h, i = self.hidden_size, self.intermediate_size
        self.expert_weights = ExpertWeights(fmt, h, i, w2_fmt if w2_fmt != fmt else None)
        self.expert_tensors = {
            key: _empty(spec.shape, spec.dtype, self.expert_device)
            for key, spec in self.expert_weights.specs(self.num_experts).items()
        }

    @property
    def weight_format(self) -> WeightFormat:
        return self.expert_weights.fmt

    def checkpoint_modules(self, name: str, proj: str | None = None) -> list[str]:
        """Checkpoint module names of every expert projection of this layer (of `proj` only:
        w13 = gate and up, w2 = down)."""
        names = expert_module_names(name, self.num_experts)
        if proj is None:
            return names
        return [n for n in names if n.endswith("down_proj") == (proj == "w2")]

    def attach_executor(self, executor: ExpertExecutor) -> None:
        """Hand the experts over. A resident executor shares the layer's tensors (so weights
        can still be loaded into them); otherwise the layer drops its references."""
        self.executor = executor
        if not isinstance(executor, ResidentExecutor):
            self.expert_tensors = {}

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """x (T, H), router_logits (T, E) → (T, H)."""
        return self.run(x, *self.select(router_logits))

    def route(self, x: torch.Tensor, gate: Linear) -> tuple[torch.Tensor, torch.Tensor]:
        """x (T, H) → (topk_weights, topk_ids) through the router linear `gate`: its GEMV and
        the top-k in one launch where the kernels take it (`kernels.router_topk`: a plain
        weight, decode-sized batches, no routing hook), `select(gate(x))` otherwise."""
        weight = gate.plain_weight(x.dtype) if self.routing is None else None
        if weight is not None:
            chosen = kernels.router_topk(x, weight, self.top_k, self.renormalize)
            if chosen is not None:
                return chosen
        return self.select(gate(x))

    def select(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router_logits (T, E) → (topk_weights float32 (T, k), topk_ids (T, k))."""
        if self.routing is None:
            return kernels.route_topk(router_logits, self.top_k, self.renormalize)
        return self.routing(router_logits)

    def run(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """The routed experts of x (T, H) for the choice `select` made → (T, H)."""
        if self.executor is None:
            self.attach_executor(ResidentExecutor(self.expert_tensors, self.expert_weights))
        return self.executor(x, topk_ids, topk_weights)

    def merge_key(self, num_tokens: int, x: torch.Tensor) -> object | None:
        """What fixes each token's bits in a `run` of `num_tokens` tokens like x: runs with
        equal keys give a token the same bits whatever the other tokens, so a prompt pass may
        join its chunks' runs into one (None: never join)."""
        if self.executor is not None and not self.executor.takes_any_width:
            return None
        return kernels.moe_merge_key(self.expert_weights, num_tokens * self.top_k, x)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An expert tensor: on the host (offloaded experts, read over the link) in a mapping of
    its own on huge pages; elsewhere torch's."""
    if device.type == "cpu":
        return host_empty(shape, dtype)
    return torch.empty(shape, dtype=dtype, device=device)
