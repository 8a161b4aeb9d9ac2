"""Giving every linear and expert layer of a model its weight format. Layers built inside
`deferred_weights()` allocate nothing; `assign_formats` then creates each one's tensors in
the format its checkpoint modules are stored in, so that a quantized model never allocates
its unquantized size first."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from xinfer.quant.base import EXPERT_PROJS
from xinfer.quant.config import QuantConfig
from xinfer.quant.unquantized import Unquantized

_DEFERRED: ContextVar[bool] = ContextVar("xinfer_deferred_weights", default=False)


@contextmanager
def deferred_weights() -> Iterator[None]:
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def is_deferred() -> bool:
    return _DEFERRED.get()


def assign_formats(
    model: nn.Module, quant: QuantConfig | None, act_dtype: torch.dtype
) -> dict[str, str]:
    """Create the tensors of every layer with `create_weights` (linears, expert layers) in
    its format: `quant.fmt` unless the layer is unquantizable (routers) or every checkpoint
    module it is made of is on the producer's ignore list. Returns name → format name."""
    plain = Unquantized(act_dtype)
    chosen = {}
    for name, module in model.named_modules():
        if not hasattr(module, "create_weights"):
            continue
        fmt = plain
        if quant is not None and quant.covers(module):
            if hasattr(module, "expert_weights"):  # experts: a format per projection
                w13, w2 = (
                    quant.format_for(module.checkpoint_modules(name, p), plain)
                    for p in EXPERT_PROJS
                )
                module.create_weights(w13, w2)
                chosen[name] = w13.name if w13 == w2 else f"{w13.name}+{w2.name}"
                continue
            fmt = quant.format_for(module.checkpoint_modules(name), plain, module.part_rows())
        module.create_weights(fmt)
        chosen[name] = fmt.name
    return chosen
