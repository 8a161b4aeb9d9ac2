"""The Triton lookup and fill kernels, run by Triton's CPU interpreter, against their
reference twins on random routing streams. The interpreter must be chosen before triton is
imported, so the comparison runs in a fresh subprocess with TRITON_INTERPRET=1: kernels
compiled by the rest of the session are unaffected, whatever the import order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def test_triton_kernels_match_twins_in_interpreter():
    pytest.importorskip("triton", reason="triton is not installed")
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(HERE / "interpret_check.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "interpreted kernels match" in proc.stdout
