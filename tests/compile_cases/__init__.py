"""Compile cases for every Triton launcher, by family; importing the package registers them
all in `CASES` (see `base.add`)."""

from compile_cases import (  # noqa: F401
    dense,
    kv_turbo,
    pdl_cases,
    quantized,
    recurrent_and_offload,
)
from compile_cases.base import CASES, Case

__all__ = ["CASES", "Case"]
