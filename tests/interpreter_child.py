"""Running a test file's Triton kernels under Triton's CPU interpreter. TRITON_INTERPRET must
be set before the kernels are decorated and must not leak into GPU tests of the same
process, so a normal run re-runs the file in a child pytest with TRITON_INTERPRET=1, and the
file's cases (marked `child_only`) run only there.

The children of a session start as soon as collection ends, one after another in a
background thread (`start_children`, from conftest), while this process runs the other
tests: the interpreter is single-threaded Python, so on CI's two cores the ~10 minutes of
children overlap the rest of the suite instead of adding to it. Each file's
`test_interpreter_child` (moved to the end of the run) reads its child's outcome; a file run
alone (no pool) runs its child in the test itself, as before."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

IS_CHILD = os.environ.get("TRITON_INTERPRET") == "1"
child_only = pytest.mark.skipif(not IS_CHILD, reason="runs in test_interpreter_child's process")
_ROOT = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 600
TEST_NAME = "test_interpreter_child"


def _run_child(test_file: str, started=None) -> tuple[int, str, str]:
    """(return code, stdout, stderr) of `test_file`'s child_only cases in a child pytest."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", test_file, "-x", "-p", "no:cacheprovider"]
    cmd += ["-k", f"not {TEST_NAME}"]
    proc = subprocess.Popen(cmd, cwd=_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    if started is not None:
        started(proc)
    try:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\n(the child ran past {CHILD_TIMEOUT_S} s and was killed)"
    return proc.returncode, out, err


class _Children:
    """The session's children, run in order in a background thread."""

    def __init__(self, files: list[str]) -> None:
        self.results: dict[str, Future] = {f: Future() for f in files}
        self._proc: subprocess.Popen | None = None
        self._stopped = False
        threading.Thread(target=self._run, args=(files,), name="interpreter-children",
                         daemon=True).start()  # fmt: skip

    def _started(self, proc: subprocess.Popen) -> None:
        self._proc = proc
        if self._stopped:
            proc.kill()

    def _run(self, files: list[str]) -> None:
        for f in files:
            if self._stopped:
                self.results[f].cancel()
                continue
            try:
                self.results[f].set_result(_run_child(f, self._started))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting test
                self.results[f].set_exception(e)

    def stop(self) -> None:
        self._stopped = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()


_children: _Children | None = None


def start_children(items: list[pytest.Item]) -> None:
    """Move the selected `test_interpreter_child` tests to the end and start their children
    now (not in a child, not where CUDA runs the compiled kernels instead)."""
    global _children
    if IS_CHILD or torch.cuda.is_available():
        return
    tests = [it for it in items if it.name == TEST_NAME]
    if not tests:
        return
    items[:] = [it for it in items if it.name != TEST_NAME] + tests
    _children = _Children([str(it.path) for it in tests])


def stop_children() -> None:
    if _children is not None:
        _children.stop()


def interpreter_child_test(test_file: str):
    """The test that runs `test_file`'s `child_only` cases in an interpreter child process."""

    @pytest.mark.skipif(IS_CHILD, reason="already inside the interpreter process")
    @pytest.mark.skipif(
        torch.cuda.is_available(), reason="CUDA present: the GPU tests run the compiled kernels"
    )
    def test_interpreter_child() -> None:
        path = str(Path(test_file).resolve())
        if _children is not None and path in _children.results:
            rc, out, err = _children.results[path].result()
        else:
            rc, out, err = _run_child(test_file)
        tail = out[-6000:] + err[-3000:]
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        assert rc == 0 and " passed" in summary and "skipped" not in summary, tail

    return test_interpreter_child


def require_interpreted(kernel) -> None:
    """Fail unless `kernel` runs under the interpreter: a kernel compiled before
    TRITON_INTERPRET=1 was set would run nothing these cases mean to check (a failure, not a
    skip, since in the child the interpreter is always meant to be on)."""
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(kernel, InterpretedFunction):
        name = getattr(kernel, "__name__", kernel)
        pytest.fail(f"{name} was compiled before TRITON_INTERPRET=1 was set in this process")
