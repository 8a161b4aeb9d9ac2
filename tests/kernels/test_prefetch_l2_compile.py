"""The L2 weight prefetch of the dense decode linears (`triton/pdl.py` `prefetch_rows_l2`,
`kernels/pdl.py` `prefetch_options`) in the code compiled for sm_90 on CPU (`triton_compile`,
no GPU): with the switch on, each kernel's PTX holds `cp.async.bulk.prefetch.L2` (one for
the weight, one more for its scales where they qualify) and every one of them comes before
`griddepcontrol.wait` — the prefetch is issued while the programs wait for the kernel
before them; with it off there is none (the wait stays). The SASS of a few shows what
ptxas made of it: `UBLKPF.L2` before `ACQBULK` (the wait). The cases are
`compile_cases/prefetch_cases.py`'s; the bits on the GPU: test_prefetch_l2_gpu.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from unittest import mock

import pytest
from interpreter_child import IS_CHILD

triton = pytest.importorskip("triton")
import triton_compile as tc  # noqa: E402
from compile_cases import CASES  # noqa: E402
from compile_cases.prefetch_cases import WITH_PREFETCH, with_prefetch  # noqa: E402

pytestmark = pytest.mark.skipif(
    IS_CHILD, reason="compiles the kernels: needs a process without TRITON_INTERPRET=1"
)

KERNELS = {
    "gemv_kernel", "router_topk_kernel", "quant_linear_gemv_kernel", "quant_linear_rows_kernel",
    "gguf_linear_gemv_kernel", "gguf_linear_rows_kernel",
}  # fmt: skip
PREFETCH = "cp.async.bulk.prefetch.L2"
WAIT = "griddepcontrol.wait"
BY_ID = {case.id: case for case in CASES}
# one case of each kernel for the checks with the switch off and of the SASS
ONE_EACH = (
    "gemv-bf16-n2048-k4096-m16-m1-bias",
    "router_topk-bf16-e128-k2048-m1",
    "quant-fp8-block128-linear-bf16-m1",
    "quant-nvfp4-linear-bf16-m1-pruned",
    "gguf-Q4_K-linear-bf16-m1",
    "gguf-Q4_K-linear-bf16-m3-one-row",
)


def _lowered(case_id: str, prefetch: bool, until: str) -> dict[str, tuple[dict, object]]:
    """Kernel name → (constexprs, PTX text or cubin bytes) of the prefetching kernels the
    case launches, compiled with PDL and the switch as asked."""
    found: dict[str, tuple[dict, object]] = {}

    def grab(jit_fn, key, signature, constexprs, options, attrs, target, llir):
        if jit_fn.fn.__name__ in KERNELS:
            _, out = tc.lower(jit_fn, signature, constexprs, options, attrs, target, until)
            found[jit_fn.fn.__name__] = (tc._constexpr_values(jit_fn, constexprs), out)
        return None

    tc._COMPILED.clear()  # compile again what another test of this process compiled
    try:
        with mock.patch.object(tc, "_compile", grab), tc.compile_only():
            with_prefetch(BY_ID[case_id].run, prefetch)
    finally:
        tc._COMPILED.clear()
    assert found, f"{case_id}: no prefetching kernel compiled"
    return found


@pytest.mark.parametrize("case_id", list(WITH_PREFETCH))
def test_prefetch_comes_before_the_wait(case_id: str) -> None:
    want = WITH_PREFETCH[case_id].split()
    for name, (consts, ptx) in _lowered(case_id, True, "ptx").items():
        flags = {k for k, v in consts.items() if k.startswith("PREFETCH") and v}
        assert flags == {f"PREFETCH_{w}" for w in want}, f"{case_id} {name}: {consts}"
        assert consts["USE_PDL"] and WAIT in ptx, f"{case_id} {name}: no PDL wait"
        assert ptx.count(PREFETCH) == len(want), f"{case_id} {name}: {ptx.count(PREFETCH)}"
        if want:
            assert ptx.rindex(PREFETCH) < ptx.index(WAIT), f"{case_id} {name}: after the wait"


@pytest.mark.parametrize("case_id", ONE_EACH)
def test_no_prefetch_when_off(case_id: str) -> None:
    for name, (consts, ptx) in _lowered(case_id, False, "ptx").items():
        assert not any(v for k, v in consts.items() if k.startswith("PREFETCH")), consts
        assert WAIT in ptx and PREFETCH not in ptx, f"{case_id} {name}"


def _sass(cubin: bytes, tmp_path: Path) -> list[str]:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not tool.exists():
        pytest.skip("Triton's nvdisasm is not installed")
    path = tmp_path / "kernel.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([str(tool), "-c", str(path)], capture_output=True, text=True, check=True)
    return [line.split("*/", 1)[1].strip() for line in out.stdout.splitlines() if "*/" in line]


@pytest.mark.parametrize("case_id", ONE_EACH)
def test_sass_prefetches_then_waits(case_id: str, tmp_path: Path) -> None:
    """ptxas's form of the per-thread prefetch: `UBLKPF.L2` in a loop over the warp's distinct
    addresses, before the wait (`ACQBULK`); with the switch off only the wait."""
    for prefetch in (True, False):
        for name, (_, cubin) in _lowered(case_id, prefetch, "cubin").items():
            ops = _sass(cubin, tmp_path)
            first_pf = next((i for i, op in enumerate(ops) if "UBLKPF.L2" in op), None)
            wait = next(i for i, op in enumerate(ops) if op.startswith("ACQBULK"))
            if prefetch:
                assert first_pf is not None and first_pf < wait, f"{case_id} {name}"
                assert all("UBLKPF" not in op for op in ops[wait:]), f"{case_id} {name}"
            else:
                assert first_pf is None, f"{case_id} {name}"
