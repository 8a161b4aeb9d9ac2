"""The CUDA driver (`libcuda`) through ctypes, for the few calls torch does not wrap: the
copy-engine fill's graph nodes (offload/graph_nodes.py). Loaded on first use, so importing
this needs no GPU."""

from __future__ import annotations

import ctypes
import functools


class DriverError(RuntimeError):
    pass


@functools.cache
def libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def check(result: int, what: str, lib: ctypes.CDLL | None = None) -> None:
    """Raise DriverError naming `what` and the driver's error when `result` is not 0
    (`lib`: the library that returned it, libcuda by default)."""
    if result != 0:
        text = ctypes.c_char_p()
        (lib or libcuda()).cuGetErrorName(result, ctypes.byref(text))
        name = text.value.decode() if text.value else f"error {result}"
        raise DriverError(f"{what} failed: {name}")
