"""Running a test file's Triton kernels under Triton's CPU interpreter. TRITON_INTERPRET must
be set before the kernels are decorated and must not leak into GPU tests of the same
process, so a normal run re-runs the file in a child pytest with TRITON_INTERPRET=1, and the
file's cases (marked `child_only`) run only there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

IS_CHILD = os.environ.get("TRITON_INTERPRET") == "1"
child_only = pytest.mark.skipif(not IS_CHILD, reason="runs in test_interpreter_child's process")
_ROOT = Path(__file__).resolve().parents[1]


def interpreter_child_test(test_file: str):
    """The test that runs `test_file`'s `child_only` cases in an interpreter child process."""

    @pytest.mark.skipif(IS_CHILD, reason="already inside the interpreter process")
    @pytest.mark.skipif(
        torch.cuda.is_available(), reason="CUDA present: the GPU tests run the compiled kernels"
    )
    def test_interpreter_child() -> None:
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        cmd = [sys.executable, "-m", "pytest", test_file, "-x", "-p", "no:cacheprovider"]
        cmd += ["-k", "not test_interpreter_child"]
        proc = subprocess.run(cmd, cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600)
        tail = proc.stdout[-6000:] + proc.stderr[-3000:]
        summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        assert proc.returncode == 0 and " passed" in summary and "skipped" not in summary, tail

    return test_interpreter_child
