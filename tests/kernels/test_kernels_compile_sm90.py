"""Every Triton launcher of the package compiled for the H200 (sm_90) on CPU: each case
calls a launcher with small CPU tensors inside `triton_compile.compile_only()`, which
compiles the launch's exact specialization (AST → TTIR → TTGIR → LLVM IR, no ptxas, no
GPU) and runs nothing. The cases are the configurations that select different kernels or
constexpr specializations: dtypes, decode / prefill tiles, GEMV / grouped MoE paths, every
quantized format and GGUF block type, windows, fp8 KV caches, head sizes, tile tables.

Why: CI runs the kernels only in Triton's CPU interpreter, which accepts code that compiled
Triton refuses; every 4-bit and FP8 kernel once failed to compile on the H200 while CI was
green. Here they fail in CI instead, named by launcher and configuration. A kernel whose
shared memory exceeds the H200's 227 KB fails too, as its launch would.

Each case asserts the kernels it expects were compiled (it cannot pass by compiling
nothing); `test_every_kernel_is_compiled` asserts that every kernel launched anywhere in
`src/xinfer` (a jit function called with a grid, `kernel[grid](...)`) was compiled by some
case. Launchers that take a torch twin for CPU tensors (`xinfer.kernels.*`, `use_triton`)
are bypassed: the cases call the launcher modules, or pass `force_triton=True`.

Outputs are never written (nothing launches); only the arguments' dtypes, shapes, strides
and alignment matter, so the tensors are small. A configuration that cannot be fixed at once
gets `marks=(pytest.mark.xfail(strict=True, reason=<the exact error>),)` in its `add` (the
coverage test then does not count it). About 90 s on two CPU cores (~220 compiles)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest
import torch
from interpreter_child import IS_CHILD

triton = pytest.importorskip("triton")
from compile_cases import CASES, Case  # noqa: E402
from compile_cases.base import BF16  # noqa: E402
from compile_cases.dense import _silu  # noqa: E402
from triton_compile import compile_only  # noqa: E402

pytestmark = pytest.mark.skipif(
    IS_CHILD, reason="compiles the kernels: needs a process without TRITON_INTERPRET=1"
)

SRC = Path(__file__).resolve().parents[2] / "src" / "xinfer"
_RESULTS: dict[str, set[str]] = {}  # case id → compiled kernel names, in this process


# --- the tests -----------------------------------------------------------------------------


def _compile_case(case: Case) -> set[str]:
    with compile_only() as log:
        case.run()
    _RESULTS[case.id] = log.names
    return log.names


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_launch_compiles_for_sm90(case: Case) -> None:
    names = _compile_case(case)
    missing = case.kernels - names
    assert not missing, f"{case.id}: {sorted(missing)} not compiled (compiled: {sorted(names)})"


def _jit_kernels_of_package() -> dict[str, str]:
    """name → module of every @triton.jit function in xinfer.kernels.triton."""
    import xinfer.kernels.triton as kernel_pkg

    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(kernel_pkg.__path__):
        module = importlib.import_module(f"{kernel_pkg.__name__}.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, triton.runtime.JITFunction) and obj.fn.__module__ == module.__name__:
                assert name not in found, f"jit function {name} in {found[name]} and {info.name}"
                found[name] = module.__name__
    return found


def _launched_names() -> set[str]:
    """Names X of every `X[grid](...)` / `mod.X[grid](...)` call in src/xinfer."""
    names = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                target = node.func.value
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Attribute):
                    names.add(target.attr)
    return names


def test_every_kernel_is_compiled() -> None:
    """Every jit kernel the package launches (helpers are compiled inside them) was compiled
    by a case above: cases not run yet in this process (a -k selection, another order) run
    here, except the expected failures."""
    jit = _jit_kernels_of_package()
    kernels = _launched_names() & set(jit)
    assert len(kernels) >= 40, f"found only {sorted(kernels)}: is the launch scan broken?"
    for case in CASES:
        if case.id not in _RESULTS and not case.marks:
            _compile_case(case)
    compiled = set().union(*_RESULTS.values())
    missing = sorted(f"{jit[name]}.{name}" for name in kernels - compiled)
    assert not missing, f"kernels no case compiled: {missing}"


_PLAIN_GLOBAL = 3  # compiled Triton refuses a jit function's read of a plain module global


@triton.jit
def _reads_plain_global(out_ptr):
    triton.language.store(out_ptr, _PLAIN_GLOBAL)


def test_compile_only_fails_like_the_gpu_and_leaves_triton_as_it_was() -> None:
    """A compile error surfaces at the launch with the kernel's name; the driver, the
    patched methods and the device caches are as before, after an error too."""
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction
    from triton_compile import DEVICE_KEY, CompileCheckError

    from xinfer.kernels.triton import activation

    def state():
        return driver._active, JITFunction.run, JITFunction._do_compile

    before = state()
    with pytest.raises(CompileCheckError, match="(?s)_reads_plain_global.*Cannot access global"):
        with compile_only():
            _reads_plain_global[(1,)](torch.empty(1))
    assert state() == before
    with pytest.raises(ZeroDivisionError), compile_only() as log:
        _silu(BF16, 768)
        assert log.names == {"silu_and_mul_kernel"}
        1 / 0  # noqa: B018
    assert state() == before
    for fn in (activation.silu_and_mul_kernel, _reads_plain_global):
        assert DEVICE_KEY not in fn.device_caches
