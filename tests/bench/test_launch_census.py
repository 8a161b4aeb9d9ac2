"""`bench/launch_census.py`: one decode step of the GPU code path, counted on a CPU. A guard on
the launch budget of decode, where every kernel costs ~1-3 µs in a CUDA graph whatever its
work: the step launches Triton kernels and linears only (plus the embedding and the greedy
argmax), no stray torch elementwise op, and a fixed number a layer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("triton")
ALLOWED_TORCH = {"torch.linear", "torch.embedding", "torch.argmax"}


def _census(arch: str) -> tuple[int, dict[str, int]]:
    out = subprocess.run(
        # the first decode step (--tokens 1) launches what the later ones do (checked on
        # both archs: 36 and 68 at 1 and at 3), in ~4 s less
        [sys.executable, str(ROOT / "bench" / "launch_census.py"), "--arch", arch, "--tokens", "1"],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout  # fmt: skip
    lines = [line for line in out.splitlines() if line.startswith("  ")]
    counts = {name: int(n) for n, name in (line.split() for line in lines)}
    total = int(out.split(" launches a decode step")[0].rsplit(" ", 1)[-1])
    return total, counts


@pytest.mark.parametrize(
    "arch, launches",
    [
        # 3 layers (one dense): per MoE layer 2 norms, qkv, qkv prep, attention + reduce,
        # o_proj, router, top-k, 2 GEMVs (the down one combines); the step's final norm,
        # LM head, argmax
        ("qwen3_moe", 36),
        # 4 layers (2 linear attention): the shared expert's MLP, the gated add (its gate
        # computed inside)
        ("qwen3_5_moe", 68),
    ],
)
def test_decode_step_launches(arch, launches):
    total, counts = _census(arch)
    stray = {n: c for n, c in counts.items() if n.startswith("torch.") and n not in ALLOWED_TORCH}
    assert not stray, f"torch ops launched in a decode step: {stray}"
    assert total == sum(counts.values())
    assert total <= launches, f"{arch}: {total} launches a decode step, budget {launches}"
