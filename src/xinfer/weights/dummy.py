"""Random weights from `config.json` alone, made directly where each tensor lives (for
benchmarking shapes whose checkpoint does not fit on disk). Linear and expert layers get
valid tensors of their weight format (N(0, 0.02) weights, quantized by the format's own
quantizer); norm weights are ones, other parameters N(0, 0.02)."""

from __future__ import annotations

import torch
from torch import nn
from tqdm import tqdm

from xinfer.quant.base import expert_key

_STD = 0.02


def _copy_into(dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
    for name, t in src.items():
        dst[name].copy_(t)


@torch.no_grad()
def init_dummy_weights(
    model: nn.Module,
    seed: int = 0,
    gen_device: torch.device | None = None,
    show_progress: bool = True,
) -> None:
    """Fill every tensor. Host-resident tensors are generated on `gen_device` (the GPU, when
    there is one) and copied, which is far faster than the CPU generator for tens of GB.
    Experts are drawn one at a time, so that resident and offloaded engines get exactly the
    same weights from the same seed."""
    gen_device = torch.device(gen_device or next(model.parameters()).device)
    gen = torch.Generator(device=gen_device).manual_seed(seed)
    formatted: set[str] = set()
    modules = list(model.named_modules())
    for prefix, module in tqdm(modules, desc="Dummy weights", disable=not show_progress):
        if hasattr(module, "expert_tensors") and hasattr(module, "create_weights"):
            ew = module.expert_weights
            for e in range(module.num_experts):
                for proj in ("w13", "w2"):
                    tensors = ew.proj_fmt(proj).dummy(*ew.proj_nk(proj), gen, _STD)
                    dst = {n: module.expert_tensors[expert_key(proj, n)][e] for n in tensors}
                    _copy_into(dst, tensors)
        elif hasattr(module, "weight_names") and hasattr(module, "create_weights"):
            fmt = module.weight_format
            tensors = fmt.dummy(module.out_features, module.in_features, gen, _STD)
            _copy_into(module.weight_tensors(), tensors)
            formatted |= {f"{prefix}.{n}" for n in module.weight_names}
    for name, t in model.named_parameters():
        if name in formatted:
            continue
        if name.endswith("norm.weight"):
            t.fill_(1.0)
            continue
        src = torch.empty(t.shape, dtype=t.dtype, device=gen_device)
        t.copy_(src.normal_(0, _STD, generator=gen))
