"""Compile cases for every Triton launcher, by family; importing the package registers them
all in `CASES` (see `base.add`)."""

from compile_cases import dense, pdl_cases, quantized, recurrent_and_offload  # noqa: F401
from compile_cases.base import CASES, Case

__all__ = ["CASES", "Case"]
