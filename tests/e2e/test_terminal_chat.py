"""`xinfer --chat` in a real pseudo-terminal on the demo model: readline line editing and
history (kept in ~/.xinfer_history), tok/s after each answer, Ctrl-C that stops the
current answer and keeps the chat going, and two Ctrl-Cs at the prompt to leave."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pty")


class Terminal:
    """A child process on a pseudo-terminal, driven like pexpect."""

    def __init__(self, args: list[str], home: Path) -> None:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "TERM": "xterm",
            "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1",
            "XINFER_LOG_LEVEL": "warning",
        }
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its controlling terminal
            os.execve(sys.executable, [sys.executable, "-m", "xinfer.cli", *args], env)
        self.output = ""
        self.seen = 0  # output before this offset was matched already
        self.exit_code: int | None = None

    def read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                self.output += os.read(self.fd, 4096).decode(errors="replace")
            except OSError:  # the child closed the terminal
                pass

    def expect(self, pattern: str, timeout: float = 180) -> str:
        """Wait for `pattern` (a regex) in the output after the last match."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output[self.seen :])
            if found:
                self.seen += found.end()
                return found.group(0)
            self.read(0.2)
            if self.exit_code is None and os.waitpid(self.pid, os.WNOHANG)[0]:
                self.exit_code = -1  # the chat died: fail now, not after the timeout
                self.read(0.2)
                break
        raise AssertionError(f"{pattern!r} not seen in:\n{self.output[self.seen :]}")

    def send(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            self.read(0.2)
        os.kill(self.pid, 9)
        raise AssertionError(f"the chat did not exit:\n{self.output}")


PROMPT = r"\n> "


def test_editing_history_and_tok_per_s(tmp_path):
    term = Terminal(["--chat", "--d", "cpu", "--max-tokens", "5"], tmp_path)
    term.expect(PROMPT)
    term.send("helo\x02l\r")  # Ctrl-B moves back one character: the line is "hello"
    term.expect(r"\[5 tokens in [\d.]+ s: [\d.]+ tok/s, first token after [\d.]+ s\]")
    term.expect(PROMPT)
    term.send("\x10\r")  # Ctrl-P: the previous line again (an empty line gets no answer)
    term.expect(r"tok/s")
    term.expect(PROMPT)
    term.send("\x04")  # Ctrl-D at the prompt quits
    assert term.wait() == 0
    history = (tmp_path / ".xinfer_history").read_text().splitlines()
    assert history[-1:] == ["hello"]  # the edited line (readline skips repeated lines)


def test_ctrl_c_at_the_prompt_hints_then_quits(tmp_path):
    """Ctrl-C right as the prompt appears (the race that once showed nothing until the next
    key): a hint, and the chat goes on; a line typed after the hint is answered; then two
    Ctrl-Cs quit."""
    term = Terminal(["--chat", "--d", "cpu", "--max-tokens", "5"], tmp_path)
    try:
        for _ in range(2):
            term.expect(PROMPT)
            term.send("hello\r")
            term.expect(r"tok/s")
            term.expect(PROMPT)
            term.send("\x03")  # Ctrl-C at the prompt: a hint, not an exit
            term.expect(r"Ctrl-C again", timeout=20)
        term.expect(PROMPT)
        term.send("\x03")
        assert term.wait() == 0
    finally:
        with contextlib.suppress(OSError):
            os.kill(term.pid, 9)


def test_ctrl_c_stops_the_answer_only(tmp_path):
    args = ["--chat", "--d", "cpu", "--max-tokens", "1500", "--ignore-eos"]
    term = Terminal(args, tmp_path)
    term.expect(PROMPT)
    term.send("Tell me a long story.\r")
    term.expect(r"story\.\r?\n")  # the echo of the line
    term.expect(r"\S")  # the answer is streaming
    term.send("\x03")
    stopped = term.expect(r"\[stopped, \d+ tokens")
    assert int(stopped.split()[1]) < 1500
    term.expect(PROMPT)
    term.send("/exit\r")
    assert term.wait() == 0
