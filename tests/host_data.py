"""A dispatch mode that records the ops turning host data into a tensor (`torch.tensor`,
`as_tensor`) or reading a device value back (`.item()`): on CUDA both copy between host and
device, which a CUDA graph capture refuses (or which syncs decode). Tests run a model's
forward under it on CPU to catch what only a GPU run would otherwise show."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostData(TorchDispatchMode):
    OPS = (torch.ops.aten.lift_fresh.default, torch.ops.aten._local_scalar_dense.default)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.OPS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def watch_forward(model, monkeypatch) -> HostData:
    """Run `model.forward` and `model.compute_logits` under a HostData from now on."""
    host_data = HostData()

    def watched(method):
        def run(*args, **kwargs):
            with host_data:
                return method(*args, **kwargs)

        return run

    monkeypatch.setattr(model, "forward", watched(model.forward))
    monkeypatch.setattr(model, "compute_logits", watched(model.compute_logits))
    return host_data
