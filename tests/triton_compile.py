"""Compile Triton kernels for the H200 (sm_90) on a CPU-only machine, from CPU tensors.

Why: CI runs our kernels only in Triton's CPU interpreter, which accepts code that compiled
Triton refuses (a plain module global read in a jit function; code after a constexpr-if
`return` compiled for the other branch: "cannot cast int32 to fp8e4nv"). Both once broke
every 4-bit and FP8 kernel on the H200 while CI was green. Triton's frontend and its MLIR
passes need no GPU, so a launch's exact specialization (argument dtypes, 16-byte alignment,
constexprs, num_warps, num_stages) can be compiled here, at the launcher's own call.

What: inside `with compile_only() as log:` a call of a launcher (any `kernel[grid](...)`
with CPU tensors) compiles each launch for GPUTarget("cuda", 90, 32) — Python AST → TTIR →
TTGIR (coalescing, MMA selection, software pipelining) → LLVM IR (shared-memory allocation,
lowering to NVVM) — and launches nothing: the launch returns right after compiling, so the
outputs stay unwritten (uninitialized). No ptxas runs: register spills are not seen, but a
kernel whose shared memory exceeds the H200's 227 KB a block raises `OutOfResources` here,
as its launch would there. `log` lists what was compiled (`log.names`, `log.records`).

The check is as good as the Triton version installed here matches the GPU machine's: a
frontend error of one version is almost always one of the other, while shared-memory sizes
follow each version's pipeliner (CI's 3.9 and the H200's 3.6 may differ by some KB).

Use it only in a process where TRITON_INTERPRET is not set (the interpreter replaces every
`@triton.jit` function at decoration time; `compile_only` then refuses to start).

Isolation: the fake driver and the patches of `JITFunction` are undone on exit, also on an
error; launches inside use a device key of their own in `JITFunction.device_caches`, whose
entries are removed on exit, so a later real (or interpreted) launch in the same process
finds the caches as they were. Nothing is written to Triton's on-disk cache."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from unittest import mock

TARGET_ARCH = 90
# Opt-in shared memory per block on sm_90 (H100/H200: 227 KB), what Triton checks at launch.
MAX_SHARED_BYTES = 232448
DEVICE_KEY = "xinfer-compile-only-sm90"  # never a real device index: no cache collision


class CompileCheckError(RuntimeError):
    """A kernel specialization that compiled Triton refuses, named with its constexprs."""


@dataclass(frozen=True)
class CompiledKernel:
    name: str  # the jit function's name
    module: str  # its module
    constexprs: dict  # parameter name → value
    num_warps: int
    num_stages: int
    shared: int  # bytes of shared memory, from the LLVM-IR stage (None if not run)


@dataclass
class CompileLog:
    records: list[CompiledKernel] = field(default_factory=list)

    @property
    def names(self) -> set[str]:
        return {r.name for r in self.records}

    def __len__(self) -> int:
        return len(self.records)


class _FakeDriver:
    """What `JITFunction.run` asks of the active driver, without CUDA."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", TARGET_ARCH, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return DEVICE_KEY

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


# (jit function, cache key) of specializations this process compiled already: a second
# launch of the same specialization (e.g. the MoE combine of every path) is only recorded.
_COMPILED: set[tuple[int, str]] = set()


def _constexpr_values(jit_fn, constexprs: dict) -> dict:
    names = [p.name for p in jit_fn.params]
    out = {}
    for path, value in constexprs.items():
        if len(path) == 1 and path[0] < len(names):
            out[names[path[0]]] = getattr(value, "value", value)
    return out


def lower(
    jit_fn, signature, constexprs, options, attrs, target, until: str, texts: dict | None = None
) -> tuple[dict, object]:
    """The stages of `triton.compile` for one specialization, IR → TTIR → TTGIR, then as far
    as `until` ("ttgir", "llir" or "cubin": Triton's bundled ptxas, still no GPU): (metadata,
    the last stage's module or bytes). `texts`, where given, gets the TTIR's text ("ttir":
    the passes after it change the module in place)."""
    from triton._C.libtriton import ir
    from triton.backends.nvidia.compiler import CUDABackend

    backend = CUDABackend(target)
    src = jit_fn.ASTSource(jit_fn, signature, constexprs, attrs)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen_fns = backend.get_codegen_implementation(options)
    mod = src.make_ir(target, options, codegen_fns, backend.get_module_map(), context)
    metadata: dict = {}
    mod = backend.make_ttir(mod, metadata, options, target.arch)
    if texts is not None:
        texts["ttir"] = str(mod)
    mod = backend.make_ttgir(mod, metadata, options, target.arch)
    if until == "ttgir":
        return metadata, mod
    llvm = backend.make_llir(mod, metadata, options, target.arch)
    if until == "llir":
        return metadata, llvm
    ptx = backend.make_ptx(llvm, metadata, options, target.arch)
    return metadata, backend.make_cubin(ptx, metadata, options, target.arch)


def _compile(jit_fn, key, signature, constexprs, options, attrs, target, llir: bool) -> int | None:
    """The frontend stages for one specialization (see `lower`); returns the shared-memory
    bytes (None without the LLVM-IR stage)."""
    metadata, _ = lower(jit_fn, signature, constexprs, options, attrs, target,
                        "llir" if llir else "ttgir")  # fmt: skip
    return metadata.get("shared") if llir else None


@contextlib.contextmanager
def compile_only(llir: bool = True, check_shared: bool = True) -> Iterator[CompileLog]:
    """Launches inside compile for sm_90 and return without running (see the module
    docstring). `llir`: also lower to LLVM IR (shared-memory allocation; about twice the
    time); `check_shared`: raise OutOfResources above MAX_SHARED_BYTES, as the launch would."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile_only needs compiled Triton: TRITON_INTERPRET=1 is set")
    from triton.runtime.driver import driver as driver_config
    from triton.runtime.errors import OutOfResources
    from triton.runtime.jit import JITFunction

    log = CompileLog()
    fake = _FakeDriver()
    touched: list = []
    original_run = JITFunction.run

    def run(self, *args, **kwargs):
        if not any(t is self for t in touched):
            touched.append(self)
        return original_run(self, *args, **kwargs)

    def do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        name = self.fn.__name__
        values = _constexpr_values(self, constexprs)
        shared = None
        if (id(self), key) not in _COMPILED:
            try:
                shared = _compile(self, key, signature, constexprs, options, attrs, fake.target,
                                  llir)  # fmt: skip
            except Exception as err:
                raise CompileCheckError(
                    f"{self.fn.__module__}.{name} {values} num_warps={options.num_warps} "
                    f"num_stages={options.num_stages}: {type(err).__name__}: {err}"
                ) from err
            if check_shared and shared is not None and shared > MAX_SHARED_BYTES:
                raise OutOfResources(shared, MAX_SHARED_BYTES, f"shared memory ({name} {values})")
            _COMPILED.add((id(self), key))
        log.records.append(
            CompiledKernel(name, self.fn.__module__, values, options.num_warps,
                           options.num_stages, shared)
        )  # fmt: skip
        return None  # `run` returns None: nothing launches

    saved_driver = driver_config._active
    driver_config.set_active(fake)
    try:
        with (
            mock.patch.object(JITFunction, "run", run),
            mock.patch.object(JITFunction, "_do_compile", do_compile),
            warnings.catch_warnings(),
        ):
            # Triton 3.9 warns once that TRITON_DEFAULT_FP_FUSION is unset; fusion only
            # matters when PTX is generated, which never happens here: noise.
            warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
            yield log
    finally:
        driver_config._active = saved_driver
        for fn in touched:
            fn.device_caches.pop(DEVICE_KEY, None)
