"""The registry of compile cases (`tests/kernels/test_kernels_compile_sm90.py`): `add` records
a launcher call and the kernels it must compile; the modules of this package add theirs when
imported (dense and attention kernels, quantized and GGUF formats, linear attention /
offload / routing)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

BF16, F16, F32, FP8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn
DT = {BF16: "bf16", F16: "fp16", F32: "fp32"}


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    run: Callable[[], object]
    kernels: frozenset[str]  # names that must be among the compiled kernels
    marks: tuple = ()


CASES: list[Case] = []


def add(case_id: str, kernels: str, fn: Callable, *args, marks: tuple = (), **kwargs) -> None:
    if any(c.id == case_id for c in CASES):
        raise AssertionError(f"duplicate case id {case_id}")
    run = functools.partial(fn, *args, **kwargs)
    CASES.append(Case(case_id, run, frozenset(kernels.split()), marks))


def add_variants(case_ids, suffix: str, wrap: Callable, what: str) -> None:
    """A case `{id}-{suffix}` for each registered case of `case_ids`: its run inside
    `wrap(run)` (a launch option forced on), its kernels and marks."""
    by_id = {case.id: case for case in CASES}
    missing = [i for i in case_ids if i not in by_id]
    if missing:
        raise AssertionError(f"{what} compile cases name unknown cases: {missing}")
    for case_id in case_ids:
        case = by_id[case_id]
        add(f"{case_id}-{suffix}", " ".join(sorted(case.kernels)), wrap, case.run,
            marks=case.marks)  # fmt: skip


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, dtype=F32) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen()).to(dtype)


MOE_GROUPED = (
    "moe_align_kernel moe_gate_up_grouped_kernel moe_down_grouped_kernel moe_combine_kernel"
)


def _routing(num_experts: int, top_k: int, renorm: bool):
    """Router outputs as the engine hands them to the expert kernels (ids int32)."""
    from xinfer.kernels import reference

    def make(tokens: int):
        logits = _randn(tokens, num_experts)
        return reference.route_topk(logits, top_k, renorm)

    return make


def reduced_apart(launch):
    """`launch` with the split-K partials added by the reduce kernel (FUSED_SPLIT_REDUCE off)."""

    def run(*args, **kwargs) -> None:
        from xinfer.kernels import gemv_launch

        saved, gemv_launch.FUSED_SPLIT_REDUCE = gemv_launch.FUSED_SPLIT_REDUCE, False
        try:
            launch(*args, **kwargs)
        finally:
            gemv_launch.FUSED_SPLIT_REDUCE = saved

    return run
