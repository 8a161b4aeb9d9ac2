"""The terminal chat (`xinfer --chat`): line editing and a persistent history through GNU
readline (the standard library's: no extra dependency, the keys users know from bash and the
Python prompt), streamed answers with their tok/s, Ctrl-C that stops the current answer only
(at the prompt: press it twice, /exit or Ctrl-D to leave), /reset and /help."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from xinfer.errors import UserError
from xinfer.sampling import SamplingParams

HELP = "/reset clears the conversation, /exit (or Ctrl-D) quits; Ctrl-C stops an answer."
HISTORY_LEN = 1000
POKE_S, POKE_FOR_S = 0.01, 1.0  # the SIGINT watcher's repeat interval and its limit


@dataclass
class Answer:
    text: str
    num_tokens: int
    first_token_s: float | None  # from the request to its first token
    seconds: float  # from the request to its last token
    is_stopped: bool  # Ctrl-C ended it

    def summary(self) -> str:
        """E.g. `[42 tokens in 3.1 s: 14.2 tok/s, first token after 0.35 s]`; the rate is
        the decode rate (tokens after the first over the time after the first)."""
        head = "stopped, " if self.is_stopped else ""
        line = f"[{head}{self.num_tokens} tokens in {self.seconds:.1f} s"
        if self.first_token_s is not None and self.num_tokens > 1:
            rate = (self.num_tokens - 1) / max(self.seconds - self.first_token_s, 1e-9)
            line += f": {rate:.1f} tok/s, first token after {self.first_token_s:.2f} s"
        return line + "]"


class CtrlC:
    """The chat's one SIGINT handler. While reading a line, Ctrl-C raises KeyboardInterrupt
    (readline then gives the prompt back); while answering it only sets `stop`, which the
    answer loop checks between engine steps, so a step is never cut in half; in between it
    is ignored, unless the quit hint is showing: then it quits (`quit`)."""

    def __init__(self) -> None:
        self.mode = "idle"  # "reading" | "answering" | "idle"
        self.stop = self.quit = self.is_hinted = False
        self.handled = 0  # SIGINTs whose handler ran (the watcher waits for this to move)

    def handle(self, signum, frame) -> None:
        self.handled += 1
        if self.mode == "reading":
            raise KeyboardInterrupt
        if self.mode == "answering":
            self.stop = True
        elif self.is_hinted:
            self.quit = True

    @contextlib.contextmanager
    def installed(self) -> Iterator[CtrlC]:
        previous = signal.signal(signal.SIGINT, self.handle)
        try:
            with _signals_reach_the_main_thread(lambda: self.handled):
                yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    def read_line(self, read_line: Callable[[str], str], prompt: str) -> str | None:
        """A line, or None when Ctrl-C ended the reading."""
        self.mode = "reading"
        try:
            return read_line(prompt)
        except KeyboardInterrupt:
            return None
        finally:
            self.mode = "idle"


@contextlib.contextmanager
def _signals_reach_the_main_thread(handled: Callable[[], int]) -> Iterator[None]:
    """The kernel hands SIGINT to any thread of the process, often one of torch's workers;
    Python then only notes it, and runs the handler once the main thread runs Python code,
    but readline sits in select() until the next key: Ctrl-C at the prompt showed nothing.
    Here every signal's wakeup byte wakes a watcher thread, which sends SIGUSR1 (a no-op
    handler) to the main thread: its select() returns EINTR and the pending SIGINT handler
    runs at once. A SIGUSR1 that lands just before the main thread enters select() (a
    Ctrl-C right as the prompt appears) interrupts nothing, so the watcher repeats it every
    POKE_S until `handled()` (the SIGINT handler's run count) moves, for at most POKE_FOR_S.
    Where the platform lacks pthread_kill, nothing changes."""
    if not hasattr(signal, "pthread_kill") or not hasattr(signal, "SIGUSR1"):
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    main = threading.main_thread().ident
    previous_usr1 = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    stopping, poking = threading.Event(), threading.Lock()

    def forward() -> None:
        seen = handled()
        while not stopping.is_set():
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data:  # the write end closed: the chat is over
                return
            if signal.SIGINT not in data:
                continue
            deadline = time.monotonic() + POKE_FOR_S
            while handled() == seen and time.monotonic() < deadline:
                with poking:  # never after the chat put SIGUSR1's old handler back
                    if stopping.is_set():
                        return
                    signal.pthread_kill(main, signal.SIGUSR1)
                time.sleep(POKE_S)
            seen = handled()

    watcher = threading.Thread(target=forward, name="xinfer-chat-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with poking:  # a SIGUSR1 sent before this is delivered by the time the lock is ours
            stopping.set()
        signal.set_wakeup_fd(previous_fd)
        os.close(write_fd)
        watcher.join(timeout=1)
        signal.signal(signal.SIGUSR1, previous_usr1)
        os.close(read_fd)


def stream_answer(engine, prompt: list[int], params: SamplingParams, ctrl_c: CtrlC) -> Answer:
    """Stream one answer to stdout until it ends or Ctrl-C; a stopped request is aborted
    (its KV blocks freed at once)."""
    start = time.perf_counter()
    rid = engine.add_request(prompt, params)
    text, count, first, is_stopped = "", 0, None, False
    ctrl_c.mode = "answering"  # `stop` may be set already: a Ctrl-C while encoding
    try:
        while engine.has_unfinished():
            if ctrl_c.stop:
                engine.abort_request(rid)
                is_stopped = True
                break
            for delta in engine.step():
                if delta.request_id == rid:
                    if first is None:
                        first = time.perf_counter() - start
                    count += len(delta.new_token_ids)
                    text += delta.new_text
                    sys.stdout.write(delta.new_text)
                    sys.stdout.flush()
    finally:
        ctrl_c.mode = "idle"
    return Answer(text, count, first, time.perf_counter() - start, is_stopped)


def history_path() -> Path:
    return Path(os.path.expanduser("~")) / ".xinfer_history"


@contextlib.contextmanager
def line_editing() -> Iterator[None]:
    """GNU readline for `input()` (editing, up-arrow history) with a history file kept
    across sessions; plain `input()` where readline is missing (Windows)."""
    try:
        import readline
    except ImportError:
        yield
        return
    path = history_path()
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(HISTORY_LEN)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            readline.write_history_file(path)


def run_chat(engine, params: SamplingParams, read_line: Callable[[str], str] = input) -> None:
    tok = engine.tokenizer
    if tok is None or not tok.has_chat_template:
        raise UserError("this model has no chat template; use --prompt instead")
    messages: list[dict[str, str]] = []
    print(f"Chat with the model. {HELP}")
    with line_editing(), CtrlC().installed() as ctrl_c:
        while not ctrl_c.quit:
            try:
                line = ctrl_c.read_line(read_line, "> ")
            except EOFError:
                break
            if line is None:  # Ctrl-C at the prompt
                if ctrl_c.is_hinted:
                    break
                ctrl_c.is_hinted = True
                print("\n(Ctrl-C again, /exit or Ctrl-D to quit)")
                continue
            ctrl_c.is_hinted = False
            command = line.strip()
            if command in ("/exit", "/quit"):
                return
            if command == "/reset":
                messages.clear()
                print("(conversation cleared)")
                continue
            if command == "/help":
                print(HELP)
                continue
            if not command:
                continue
            messages.append({"role": "user", "content": line})
            ctrl_c.mode, ctrl_c.stop = "answering", False  # from Enter on, Ctrl-C stops it
            prompt = tok.encode_chat(messages)  # typed control tokens stay text
            try:
                answer = stream_answer(engine, prompt, params, ctrl_c)
            except UserError as e:  # e.g. past --max-model-len: this message goes, not the chat
                ctrl_c.mode = "idle"
                messages.pop()
                print(f"xinfer: error: {e}; the message was dropped (/reset starts over)",
                      file=sys.stderr, flush=True)  # fmt: skip
                continue
            print(f"\n{answer.summary()}", flush=True)
            messages.append({"role": "assistant", "content": answer.text})
    print()
