"""What a Triton kernel costs the H200's instruction issue, found on a CPU-only machine: the
launch's exact specialization compiled for sm_90 to SASS (Triton's own ptxas and nvdisasm,
no GPU), its main loop found (the longest backward branch), and the loop's instructions
counted by kind — global loads, shared-memory traffic and barriers (layout conversions),
local memory (register spills), float math, integer/bit work, conversions.

Why: a GEMV that decodes quantized weights in registers is bound by instruction issue, not
by bytes, when the decoder is long (GGUF Q4_K reads 530-700 GB/s where bf16 reads 2,600).
Device time is scarce; the SASS shows before any H200 run whether a variant of a kernel
issues fewer instructions a weight and whether it converts layouts through shared memory
in its loop (the 3×-slower Q4_K word reads of 2026-12-04 were written without this check).

The report's `warp-instr/weight` = loop instructions × warps ÷ weights a loop iteration
reads; at the H200's issue rate (132 SMs × 4 schedulers × ~1.98 GHz ≈ 1.05 T warp
instructions/s) it gives the kernel's issue floor for a call, shown beside its HBM floor.
Both are floors; the measured time is their max plus latency the warps cannot hide.

    python3 bench/sass_report.py [--cases gguf-q4k,gguf-q8_0,...] [--sass-dir DIR]

The cases (launches, and the weights and bytes for the floors) live in `sass_cases.py`."""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from sass_cases import CASES, Case  # noqa: E402  (the launches it reports)

ISSUE_RATE = 132 * 4 * 1.98e9  # warp instructions a second, H200 (all SMs, one per scheduler)
HBM_BYTES_S = 4.2e12  # the device copy rate of ANCHORS.md

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\s+`?\(?(\.L_x_\d+)")

KINDS = {
    "global load": ("LDG",),
    "global store": ("STG", "RED", "ATOMG"),
    "shared ld/st": ("LDS", "STS", "LDSM", "STSM"),
    "barrier": ("BAR",),
    "spill (local)": ("LDL", "STL"),
    "float fma/mul/add": ("FFMA", "FMUL", "FADD", "HFMA2", "HMUL2", "HADD2", "FFMA2"),
    "conversion": ("I2F", "F2I", "F2F", "I2FP", "F2FP", "I2I"),
    "int/bit": (
        "LOP3",
        "SHF",
        "IMAD",
        "IADD3",
        "LEA",
        "SEL",
        "PRMT",
        "IABS",
        "VIADD",
        "IDP",
        "BMSK",
        "SGXT",
        "BFE",
        "BFI",
        "IMNMX",
        "VIMNMX",
        "ISETP",
        "FSETP",
        "PLOP3",
        "IMUL",
    ),
    "shuffle": ("SHFL",),
    "tensor core": ("HMMA", "IMMA", "HGMMA", "QGMMA", "IGMMA"),
}


@dataclass
class KernelSass:
    name: str
    num_warps: int
    registers: int
    spill_bytes: int
    shared_bytes: int
    total: int
    loop: int  # instructions in the main loop's body (0: no loop)
    loop_kinds: dict[str, int] = field(default_factory=dict)
    loop_ops: dict[str, int] = field(default_factory=dict)  # by opcode


def _classify(op: str) -> str:
    for kind, ops in KINDS.items():
        if op in ops or (op[:3] in ops and kind != "int/bit"):
            return kind
    return "other"


def parse_sass(text: str) -> tuple[int, list[str]]:
    """(instruction count, opcodes of the main loop): the loop is the longest span from a
    label to a later branch back to it."""
    addr_of_label: dict[str, int] = {}
    instrs: list[tuple[int, str, str]] = []  # (address, opcode, line)
    pending: list[str] = []
    for line in text.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        for label in pending:
            addr_of_label[label] = addr
        pending = []
        instrs.append((addr, m.group(3), line))
    best = (0, 0)
    for addr, op, line in instrs:
        b = _BRANCH.search(line) if op == "BRA" else None
        if b and b.group(1) in addr_of_label and addr_of_label[b.group(1)] <= addr:
            start = addr_of_label[b.group(1)]
            if addr - start > best[1] - best[0]:
                best = (start, addr)
    loop = [op for addr, op, _ in instrs if best[0] <= addr <= best[1]] if best[1] else []
    return len(instrs), loop


def _tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def _resources(cubin: Path) -> tuple[int, int]:
    out = subprocess.run([_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    reg = re.search(r"REG:(\d+)", out)
    local = re.search(r"LOCAL:(\d+)", out)
    return int(reg.group(1)) if reg else -1, int(local.group(1)) if local else 0


def compile_to_sass(launch: Callable[[], object], sass_dir: Path | None = None) -> list[KernelSass]:
    """Every kernel `launch` compiles (CPU tensors; nothing runs), lowered to SASS."""
    import triton_compile as tc

    found: list[KernelSass] = []
    scratch = None if sass_dir else tempfile.TemporaryDirectory(prefix="sass_")
    work = Path(sass_dir or scratch.name)
    work.mkdir(parents=True, exist_ok=True)

    def to_sass(jit_fn, key, signature, constexprs, options, attrs, target, llir):
        md, cubin_bytes = tc.lower(jit_fn, signature, constexprs, options, attrs, target, "cubin")
        name = jit_fn.fn.__name__
        cubin = work / f"{name}_{len(found)}.cubin"
        cubin.write_bytes(cubin_bytes)
        sass = subprocess.run([_tool("nvdisasm"), "-c", str(cubin)], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
        (work / f"{name}_{len(found)}.sass").write_text(sass)
        total, loop = parse_sass(sass)
        regs, local = _resources(cubin)
        kinds = collections.Counter(_classify(op) for op in loop)
        found.append(KernelSass(name, options.num_warps, regs, local, md.get("shared") or 0,
                                total, len(loop), dict(kinds),
                                dict(collections.Counter(loop))))  # fmt: skip
        return md.get("shared")

    saved = tc._compile
    tc._COMPILED.clear()
    tc._compile = to_sass
    try:
        with tc.compile_only():
            launch()
    finally:
        tc._compile = saved
        tc._COMPILED.clear()
        if scratch is not None:
            scratch.cleanup()
    return found


def report(name: str, case: Case, sass_dir: Path | None) -> list[str]:
    lines = []
    for k in compile_to_sass(case.launch, sass_dir / name if sass_dir else None):
        kinds = ", ".join(f"{n} {c}" for n, c in sorted(k.loop_kinds.items(), key=lambda x: -x[1]))
        per_w = ""
        if k.name in case.per_iter and k.loop:
            wi = k.loop * k.num_warps / case.per_iter[k.name]
            issue_us = wi * case.call_weights[k.name] / ISSUE_RATE * 1e6
            hbm_us = case.call_bytes[k.name] / HBM_BYTES_S * 1e6
            per_w = (
                f" | {wi:.3f} warp-instr/weight: issue floor {issue_us:.1f} µs, HBM {hbm_us:.1f} µs"
            )
            if k.name in case.programs:  # loop iterations in all = the call's weights / a step's
                steps = case.call_weights[k.name] / case.per_iter[k.name]
                once = k.total - case.loop_copies.get(k.name, 1) * k.loop
                executed = once * k.num_warps * case.programs[k.name]
                executed += k.loop * k.num_warps * steps
                per_w += f", all executed {executed / ISSUE_RATE * 1e6:.1f} µs"
        lines.append(
            f"{name:10s} {k.name:34s} warps {k.num_warps} regs {k.registers} spill {k.spill_bytes} "
            f"smem {k.shared_bytes} | {k.total} instr, loop {k.loop}{per_w}\n    loop: {kinds}"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--sass-dir", type=Path, default=None, help="keep the cubins and SASS here")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("needs compiled Triton: unset TRITON_INTERPRET")
    for name in args.cases.split(","):
        for line in report(name, CASES[name](), args.sass_dir):
            print(line, flush=True)


if __name__ == "__main__":
    main()
