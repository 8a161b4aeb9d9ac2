"""Checks a format's `convert` applies to each checkpoint tensor: the dtype and shape its
producer documents, refused with one sentence naming the format when they differ."""

from __future__ import annotations

import torch

from xinfer.errors import UserError

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def expect(
    fmt: str, name: str, tensor: torch.Tensor, shape: tuple[int, ...], dtypes: tuple
) -> None:
    """Raise unless `tensor` has `shape` and one of `dtypes`."""
    if tensor.dtype not in dtypes or tuple(tensor.shape) != tuple(shape):
        want = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        raise UserError(
            f"checkpoint tensor {name!r} is {str(tensor.dtype).removeprefix('torch.')} "
            f"{tuple(tensor.shape)}, but the declared {fmt} format stores it as {want} "
            f"{tuple(shape)}; does quantization_config match the weights?"
        )


def float_scale(fmt: str, name: str, tensor: torch.Tensor, shape, dtype: torch.dtype):
    """A float scale tensor of `shape`, cast to `dtype` when that loses nothing."""
    expect(fmt, name, tensor, shape, _FLOATS)
    out = tensor.to(dtype)
    if tensor.dtype != dtype and not torch.equal(out.to(tensor.dtype), tensor):
        raise UserError(
            f"checkpoint tensor {name!r} holds {tensor.dtype} scales that {dtype} cannot "
            f"represent exactly; the {fmt} format expects {dtype} scales"
        )
    return out


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
