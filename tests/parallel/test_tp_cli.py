"""The `xinfer` command with several devices (2 CPU ranks, gloo), end to end: the one-shot
output equals one device's, under our launcher and under torchrun; sizes that do not divide
are refused before any rank starts; and a rank that dies — a follower or rank 0 — ends the
others within seconds with one message, never a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

ARGS = ["--prompt", "The quick brown fox", "--max-tokens", "12", "--ignore-eos"]
DEADLINE_S = 10.0  # a dead rank must end the run within this


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    from chat_model import write_chat_model

    return write_chat_model(tmp_path_factory.mktemp("tp-chat"))


def _cli(*args: str, prefix: tuple[str, ...] = ("-m", "xinfer.cli")) -> list[str]:
    return [sys.executable, *prefix, *args]


def _run(cmd: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def one_device_text(chat_dir):
    proc = _run(_cli("--m", str(chat_dir), "--d", "cpu", *ARGS))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cli_tp2_equals_one_device(chat_dir, one_device_text):
    proc = _run(_cli("--m", str(chat_dir), "--d", "cpu,cpu", *ARGS))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == one_device_text
    assert "tensor parallel: 2 ranks (gloo)" in proc.stderr


def test_torchrun_tp2_equals_one_device(chat_dir, one_device_text):
    """Multi-node form, on one host: torchrun starts every rank; rank 0 prints. (The long
    option names: torchrun takes `--m` and `--d` for abbreviations of its own options.)"""
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m")
    args = ("xinfer.cli", "--model", str(chat_dir), "--device", "cpu,cpu", *ARGS)
    proc = _run(_cli(*args, prefix=torchrun))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == one_device_text


def test_heads_that_do_not_divide_are_refused(chat_dir):
    t0 = time.monotonic()
    proc = _run(_cli("--m", str(chat_dir), "--d", "cpu,cpu,cpu", *ARGS))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "needs the number of attention heads (4) to divide evenly" in proc.stderr
    assert "rank 1" not in proc.stderr and time.monotonic() - t0 < 60  # nothing started


class _Run:
    """A long `--d cpu,cpu` generation; knows the follower's pid and when tokens flow."""

    def __init__(self, chat_dir) -> None:
        args = ["--prompt", "hello", "--max-tokens", "100000"]  # ~500 tokens: to the end
        cmd = _cli("--m", str(chat_dir), "--d", "cpu,cpu", "--ignore-eos", *args)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stderr: list[str] = []
        self.follower_pid: int | None = None
        self.streaming = threading.Event()
        threading.Thread(target=self._read_err, daemon=True).start()
        threading.Thread(target=self._read_out, daemon=True).start()

    def _read_err(self) -> None:
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            self.stderr.append(line)
            if "rank 1 on cpu started (pid " in line:
                self.follower_pid = int(line.rsplit("pid ", 1)[1].rstrip(")\n"))

    def _read_out(self) -> None:
        self.has_output = bool(self.proc.stdout.read(1))
        self.streaming.set()  # the first token, or the end of a run that failed
        self.proc.stdout.read()

    def wait_streaming(self) -> None:
        assert self.streaming.wait(180) and self.has_output, "".join(self.stderr)
        assert self.follower_pid is not None, "".join(self.stderr)


def _is_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_killed_follower_ends_the_run(chat_dir):
    run = _Run(chat_dir)
    run.wait_streaming()
    os.kill(run.follower_pid, signal.SIGKILL)
    t0 = time.monotonic()
    code = run.proc.wait(timeout=60)
    elapsed = time.monotonic() - t0
    time.sleep(0.2)  # the reader thread's last lines
    err = "".join(run.stderr)
    assert code == 1, err
    assert elapsed < DEADLINE_S, f"took {elapsed:.1f} s"
    assert "xinfer: error: tensor-parallel rank 1 (cpu) was killed; stopping every rank" in err


def test_killed_rank0_ends_the_follower(chat_dir):
    run = _Run(chat_dir)
    run.wait_streaming()
    run.proc.kill()
    run.proc.wait()
    t0 = time.monotonic()
    while not _is_gone(run.follower_pid) and time.monotonic() - t0 < 60:
        time.sleep(0.05)
    elapsed = time.monotonic() - t0
    if not _is_gone(run.follower_pid):
        os.kill(run.follower_pid, signal.SIGKILL)
    assert elapsed < DEADLINE_S, f"the follower outlived rank 0 by {elapsed:.1f} s"
    time.sleep(0.2)
    assert "tensor-parallel rank 1: rank 0 exited; stopping" in "".join(run.stderr)
