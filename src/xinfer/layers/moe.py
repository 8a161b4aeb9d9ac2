"""The routed-expert layer: router logits → top-k → an ExpertExecutor. The layer owns the `[E, ...]`
expert tensors only until the engine hands them to an executor (resident or offloaded);
it never knows where the experts live."""

from __future__ import annotations

import torch
from torch import nn

from xinfer import kernels
from xinfer.offload.executor import ExpertExecutor, ResidentExecutor


class FusedMoE(nn.Module):
    """Expert tensors: `w13` (E, 2I, H) = [gate | up] rows, `w2` (E, H, I)."""

    # Tensor parallel: every rank holds a slice of every expert's intermediate dim.
    tp_plan = {"w13": "expert_gate_up", "w2": "expert_down"}
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
        # Plain tensors, not parameters: they may live on the host while the model is on GPU.
        kw = {"device": expert_device} if expert_device is not None else {}
        self.expert_tensors: dict[str, torch.Tensor] = {
            "w13": torch.empty(num_experts, 2 * intermediate_size, hidden_size, **kw),
            "w2": torch.empty(num_experts, hidden_size, intermediate_size, **kw),
        }
        self.executor: ExpertExecutor | None = None

    def attach_executor(self, executor: ExpertExecutor) -> None:
        """Hand the experts over. A resident executor shares the layer's tensors (so weights
        can still be loaded into them); otherwise the layer drops its references."""
        self.executor = executor
        if not isinstance(executor, ResidentExecutor):
            self.expert_tensors = {}

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """x (T, H), router_logits (T, E) → (T, H)."""
        if self.executor is None:
            self.attach_executor(ResidentExecutor(self.expert_tensors))
        topk_weights, topk_ids = kernels.route_topk(router_logits, self.top_k, self.renormalize)
        return self.executor(x, topk_ids, topk_weights)
