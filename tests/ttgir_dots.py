"""The tensor-core dots of kernels compiled for sm_90 on CPU (`triton_compile`, no GPU): each
launch's TTIR and TTGIR text, the dots parsed from the TTGIR (MMA version, M x N x K, the
operands' kWidth), and the kWidth Triton 3.6 gives each MMAv2 dot, modelled from the TTIR.

Why: Triton 3.6 (the GPU machine's) picks an MMAv2 operand's kWidth from its producers
(AccelerateMatmul `computeOrigBitWidth`): 32 / b, where b is the narrowest of the operand's
type and of the tensor loads among its producers, halved when a `tt.join` is among them
(8-bit codes unpacked into nibbles by a join: b = 4, kWidth 8). An MMAv2 operand of kWidth w
spans 4w elements along K, and where K < 4w Triton 3.6 sums the wrong elements (a turbo4
engine with head_dim 16 decoded wrong tokens on the H100: `test_kv_turbo_compile.py`).
Triton 3.9 (CI's) gives the same dots kWidth 4, join or not, whatever K, so the kWidth of
the installed Triton alone cannot show the fault; `Dot.kwidth_36` models 3.6's choice from
the TTIR (the producers as 3.6's backward slice finds them, over-approximated: every op but
region, dot, reduce and call ops is followed, block arguments are not), and under Triton
3.6 the tests check the model against what 3.6 compiled (`pip install triton==3.6.0
--target DIR`, then PYTHONPATH=DIR:src:tests: the model and 3.6 agree on every dot of
`test_quant_dot_compile.py`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from unittest import mock

import triton_compile as tc

# tt.dot's A operand: tensor<M x K x type, #ttg.dot_op<{opIdx = 0, parent = #mma.., kWidth = w}>>
DOT_A = re.compile(
    r"tt\.dot .*?: tensor<(\d+)x(\d+)x\w+, #ttg\.dot_op<\{opIdx = 0, parent = (#\w+), "
    r"kWidth = (\d+)\}>>"
)


@dataclass(frozen=True)
class Lowered:
    ttir: str
    ttgir: str


def lowered(launch, only: set[str] | None = None) -> dict[str, Lowered]:
    """Kernel name → TTIR and TTGIR text of every launch `launch` makes (compiled, not run;
    a kernel compiled twice: the last); `only`: the kernels to compile (None: all)."""
    found: dict[str, Lowered] = {}

    def grab(jit_fn, key, signature, constexprs, options, attrs, target, llir):
        if only is not None and jit_fn.fn.__name__ not in only:
            return None
        texts: dict[str, str] = {}
        _, module = tc.lower(
            jit_fn, signature, constexprs, options, attrs, target, "ttgir", texts=texts
        )
        found[jit_fn.fn.__name__] = Lowered(texts["ttir"], str(module))
        return None

    tc._COMPILED.clear()  # compile again what another test of this process compiled
    try:
        with mock.patch.object(tc, "_compile", grab), tc.compile_only():
            launch()
    finally:
        tc._COMPILED.clear()
    return found


def ttgir(launch) -> dict[str, str]:
    """Kernel name → TTGIR text of every launch `launch` makes (compiled, not run)."""
    return {name: low.ttgir for name, low in lowered(launch).items()}


@dataclass(frozen=True)
class Dot:
    version: int  # 2: MMAv2 (mma.sync), 3: MMAv3 (wgmma), 0: no MMA (FMA)
    m: int
    n: int
    k: int
    kwidth: int | None  # the MMAv2 operands' kWidth as compiled (A's; B's asserted equal)
    kwidth_36: int | None  # Triton 3.6's kWidth for an MMAv2 dot (see the docstring)
    joined: bool  # a tt.join among the operands' producers (TTIR)

    def __str__(self) -> str:
        kind = {0: "FMA", 2: "MMAv2", 3: "MMAv3"}[self.version]
        widths = f" kWidth {self.kwidth} (3.6: {self.kwidth_36})" if self.version == 2 else ""
        return f"{kind} {self.m}x{self.n}x{self.k}{widths}{' joined' if self.joined else ''}"


_DOT_OP = re.compile(r"= (tt\.dot|ttng\.warp_group_dot) ")
_SHAPE = re.compile(r"(?:tensor|!ttg\.memdesc)<(\d+)x(\d+)x")
_KWIDTH = re.compile(r"opIdx = (\d), parent = (#\w+)(?:, kWidth = (\d+))?\}")
_RESULT_ENC = re.compile(r"tensor<\d+x\d+x\w+, (#\w+)>")
_SIGNATURE = re.compile(r" : ((?:tensor|!ttg\.memdesc)<.*)$")


def _types(line: str) -> list[str]:
    """The operand and result types of a dot's line: [A, B, D]."""
    sig = _SIGNATURE.search(line.split(" loc(")[0]).group(1)
    ab, d = sig.rsplit(" -> ", 1)
    a, b = ab.split(" * ")
    return [a, b, d]


def _version(text: str, enc: str) -> int:
    found = re.search(rf"^{enc} = #ttg\.nvidia_mma<\{{versionMajor = (\d)", text, re.M)
    if found:
        return int(found.group(1))
    assert re.search(rf"^{enc} = #ttg\.blocked<", text, re.M), f"unknown dot layout {enc}"
    return 0


def _ttgir_dots(text: str) -> list[tuple[int, int, int, int, int | None]]:
    """(version, M, N, K, kWidth) of each dot of a TTGIR, in order."""
    out = []
    for line in text.splitlines():
        if not _DOT_OP.search(line):
            continue
        a, b, d = _types(line)
        (m, k), (k_b, n) = map(int, _SHAPE.search(a).groups()), map(int, _SHAPE.search(b).groups())
        assert k == k_b, line
        version = _version(text, _RESULT_ENC.search(d).group(1))
        kwidth = None
        if version == 2:
            widths = {int(_KWIDTH.search(t).group(3)) for t in (a, b)}
            assert len(widths) == 1, f"A and B with other kWidths: {line}"
            kwidth = widths.pop()
        out.append((version, m, n, k, kwidth))
    return out


# --- Triton 3.6's kWidth, modelled on the TTIR ---------------------------------------------

_DEF = re.compile(r"^\s*(%[\w.$-]+)(?::\d+)? = ([\w.]+)(.*)$")
_NAME = re.compile(r"%[\w.$-]+")
# ops whose results 3.6's slice does not look through (not elementwise, view, load, broadcast)
_STOP = re.compile(r"^(scf\.|tt\.dot|tt\.reduce|tt\.scan|tt\.call|tt\.atomic|tt\.histogram)")


def _bits(element: str) -> int:
    if element == "bf16":
        return 16
    if element.startswith("f8"):
        return 8
    if element.startswith("f4"):
        return 4
    found = re.fullmatch(r"[if](\d+)", element)
    assert found, f"element type {element}"
    return int(found.group(1))


def _element(tensor_type: str) -> str:
    """The element type of `tensor<AxBx..xT>` (T a pointer: its pointee)."""
    ptr = re.search(r"!tt\.ptr<(\w+)>", tensor_type)
    return ptr.group(1) if ptr else re.search(r"x([a-zA-Z]\w*)[,>]", tensor_type).group(1)


def _definitions(ttir: str) -> dict[str, tuple[str, list[str], str]]:
    """SSA name → (op, operand names, type text) of each op of a TTIR."""
    defs = {}
    for line in ttir.splitlines():
        found = _DEF.match(line)
        if found:
            name, op, rest = found.groups()
            rest = rest.split(" loc(")[0]
            args, _, types = rest.rpartition(" : ")
            names = [n.split("#")[0] for n in _NAME.findall(args if args else rest)]
            defs[name] = (op, names, types)
    return defs


def _orig_bits(defs: dict, operand: str, final: int) -> tuple[int, bool]:
    """3.6's `computeOrigBitWidth` of a dot operand: (bits, whether a join is among its
    producers)."""
    bits, joined, seen, todo = final, False, set(), [operand]
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:  # block and function arguments: not followed
            continue
        seen.add(name)
        op, args, types = defs[name]
        if _STOP.match(op):
            continue
        if op == "tt.load" and types.startswith("tensor<"):
            bits = min(bits, _bits(_element(types)))
        joined |= op == "tt.join"
        todo.extend(args)
    return (bits // 2 if joined else bits), joined


def _ttir_dots(ttir: str) -> list[tuple[int, bool]]:
    """(3.6's MMAv2 kWidth, joined) of each tt.dot of a TTIR, in order."""
    defs = _definitions(ttir)
    out = []
    for line in ttir.splitlines():
        if " = tt.dot " not in line:
            continue
        _, args, types = defs[_DEF.match(line).group(1)]
        a_type, b_type = types.split(" -> ")[0].split(" * ")
        (a_bits, a_join), (b_bits, b_join) = (
            _orig_bits(defs, args[0], _bits(_element(a_type))),
            _orig_bits(defs, args[1], _bits(_element(b_type))),
        )
        out.append((32 // min(a_bits, b_bits), a_join or b_join))
    return out


def dots(low: Lowered) -> list[Dot]:
    """The dots of a compiled kernel, in program order (TTIR and TTGIR dots paired by order)."""
    compiled, modelled = _ttgir_dots(low.ttgir), _ttir_dots(low.ttir)
    assert len(compiled) == len(modelled), f"TTIR dots {modelled}, TTGIR dots {compiled}"
    return [
        Dot(version, m, n, k, kwidth, width_36 if version == 2 else None, joined)
        for (version, m, n, k, kwidth), (width_36, joined) in zip(compiled, modelled)
    ]


def mmav2_faults(kernel: str, found: list[Dot]) -> list[str]:
    """What is wrong with the MMAv2 dots of `found` (empty: nothing): an operand of kWidth w
    spans 4w elements along K, so 4w must not exceed K, both for the installed Triton's
    kWidth and for 3.6's (`Dot.kwidth_36`)."""
    faults = []
    for dot in found:
        if dot.version != 2:
            continue
        if 4 * dot.kwidth > dot.k:
            faults.append(f"{kernel}: {dot}: 4 kWidth > K as compiled here")
        if 4 * dot.kwidth_36 > dot.k:
            faults.append(f"{kernel}: {dot}: 4 kWidth > K under Triton 3.6")
    return faults
