"""Rules of compiled Triton that the CPU interpreter (CI's way of running our kernels) does
not enforce, checked on the source of every `@triton.jit` function in the package:

- a global a jit function reads must be a module, another jit function, a `tl.constexpr`
  object or a builtin — compiled Triton refuses a plain Python number ("Cannot access
  global variable ... from within @jit'ed function"), the interpreter reads it;
- no statements after an `if` whose body returns (without `else`): compiled Triton builds
  them for the branch that returned too, so code meant for other formats gets compiled
  (and an 8-bit weight's load got a byte loader's `other=0`: "cannot cast int32 to fp8").

Both broke every 4-bit and FP8 kernel on the H200 (2026-12-04) while CI was green."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import textwrap
import types

import pytest
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

import xinfer.kernels.triton as kernel_pkg

# (interpreted where the modules were imported under TRITON_INTERPRET=1: the source is the same)
JIT_TYPES = (triton.runtime.JITFunction, InterpretedFunction)


def _jit_functions():
    found = []
    for info in pkgutil.iter_modules(kernel_pkg.__path__):
        module = importlib.import_module(f"{kernel_pkg.__name__}.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, JIT_TYPES) and obj.fn.__module__ == module.__name__:
                found.append(pytest.param(obj, id=f"{info.name}.{name}"))
    return found


JIT = _jit_functions()


def _tree(jit) -> ast.FunctionDef:
    return ast.parse(textwrap.dedent(inspect.getsource(jit.fn))).body[0]


def _local_names(fn: ast.FunctionDef) -> set[str]:
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _allowed_global(value) -> bool:
    return (
        isinstance(value, (types.ModuleType, *JIT_TYPES, tl.constexpr))
        or value is tl.constexpr
        or callable(value)  # builtins, tl functions, Python helpers Triton itself refuses
        or value is None
    )


def test_the_package_has_jit_functions():
    assert len(JIT) > 30


@pytest.mark.parametrize("jit", JIT)
def test_globals_read_are_modules_jit_functions_or_constexpr(jit):
    fn = _tree(jit)
    local = _local_names(fn)
    bad = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
            if node.id in jit.fn.__globals__:
                if not _allowed_global(jit.fn.__globals__[node.id]):
                    bad.append(node.id)
            elif not hasattr(builtins, node.id):
                bad.append(f"{node.id} (undefined)")
    assert not bad, f"{jit.fn.__name__} reads globals compiled Triton refuses: {bad}"


def _returns(stmts: list[ast.stmt]) -> bool:
    return bool(stmts) and isinstance(stmts[-1], ast.Return)


def _constexpr_params(fn: ast.FunctionDef) -> set[str]:
    return {
        a.arg
        for a in fn.args.args + fn.args.kwonlyargs
        if a.annotation is not None and ast.unparse(a.annotation).endswith("constexpr")
    }


def _decided_at_compile_time(test: ast.expr, constexprs: set[str]) -> bool:
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    return bool(names) and names <= constexprs


@pytest.mark.parametrize("jit", JIT)
def test_no_code_after_a_constexpr_if_that_returns(jit):
    """(An early exit on a runtime condition — `if pid >= n: return` — is fine.)"""
    fn = _tree(jit)
    constexprs, bad = _constexpr_params(fn), []
    for node in ast.walk(fn):
        for field in ("body", "orelse"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            for stmt in stmts[:-1]:
                if (
                    isinstance(stmt, ast.If)
                    and _returns(stmt.body)
                    and not stmt.orelse
                    and _decided_at_compile_time(stmt.test, constexprs)
                ):
                    bad.append(stmt.lineno)
    assert not bad, (
        f"{jit.fn.__name__}: an `if` returns and code follows it (lines {bad} of the "
        "function): write the rest as its `else`"
    )
