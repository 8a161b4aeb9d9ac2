"""Random weights in a quantized format's engine tensors, for the kernel tests: one (N, K)
weight, or an `[E, ...]` expert set of `count` of them, quantized by the format itself from
unit-variance values scaled by 1/sqrt(K); act-order formats in a random column order each."""

from __future__ import annotations

import torch


def random_weights(fmt, n: int, k: int, seed: int, count: int | None = None, device=None):
    """The engine tensors of one random (N, K) weight in `fmt`, or of `count` stacked."""
    g = torch.Generator(device=device or "cpu").manual_seed(seed)

    def make():
        w = torch.randn(n, k, generator=g, device=device) / k**0.5
        if not getattr(fmt, "act_order", False):
            return fmt.engine_tensors(w)
        return fmt.engine_tensors(w, perm=torch.randperm(k, generator=g, device=device))

    if count is None:
        return make()
    parts = [make() for _ in range(count)]
    return {name: torch.stack([p[name] for p in parts]) for name in parts[0]}
