"""Random weights from `config.json` alone, made directly where each tensor lives (for
benchmarking shapes whose checkpoint does not fit on disk). Norm weights are ones."""

from __future__ import annotations

import torch
from torch import nn
from tqdm import tqdm

from xinfer.weights.loader import named_targets

_STD = 0.02


@torch.no_grad()
def init_dummy_weights(
    model: nn.Module,
    seed: int = 0,
    gen_device: torch.device | None = None,
    show_progress: bool = True,
) -> None:
    """Fill every target with N(0, 0.02) (norms: 1). Host-resident tensors are generated on
    `gen_device` (the GPU, when there is one) in chunks and copied, which is far faster than
    the CPU generator for tens of GB."""
    targets = named_targets(model)
    gen_device = torch.device(gen_device or next(iter(targets.values())).device)
    gen = torch.Generator(device=gen_device).manual_seed(seed)
    for name, t in tqdm(targets.items(), desc="Dummy weights", disable=not show_progress):
        if name.endswith("norm.weight"):
            t.fill_(1.0)
            continue
        if t.dim() < 3:
            src = torch.empty(t.shape, dtype=t.dtype, device=gen_device)
            t.copy_(src.normal_(0, _STD, generator=gen))
            continue
        # (E, ...) expert stacks: one expert at a time, wherever they live, so that resident
        # and offloaded engines draw exactly the same weights from the same seed.
        for i in range(t.shape[0]):
            src = torch.empty(t.shape[1:], dtype=t.dtype, device=gen_device)
            t[i].copy_(src.normal_(0, _STD, generator=gen))
