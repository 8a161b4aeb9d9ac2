"""Server lifecycle: the port is bound before the model loads (a busy port fails at once with
one sentence; /health answers 503 "loading" until the engine is attached); SIGTERM stops
accepting, lets a running stream go on for the grace period, then aborts it and exits within
grace + 2 s; a second signal exits at once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
import uvicorn
from server_process import SRC, start_server

from xinfer.server.app import build_app
from xinfer.server.launch import _run, _Server, bind_socket

GRACE_S = 2.0


def _env() -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("XINFER_API_KEY", None)
    return env


def test_busy_port_fails_at_once_with_one_sentence(chat_model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "xinfer.cli", "--m", str(chat_model_dir), "--d", "cpu"]
        cmd += ["--host", "127.0.0.1", "--port", str(port)]
        env = {**_env(), "XINFER_LOG_LEVEL": "INFO"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "--port" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "KV cache" not in proc.stderr  # it failed before loading the model


def test_health_is_503_loading_until_the_engine_is_attached():
    release = threading.Event()
    engine = SimpleNamespace(is_alive=True, observer=None, max_model_len=8)
    app = build_app(None, "m")
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = _Server(uvicorn.Config(app, log_level="warning", lifespan="off"))

    def load():
        assert release.wait(120)
        return engine

    def attach(e):
        from xinfer.server.app import attach_engine

        attach_engine(app, e)

    result = {}
    thread = threading.Thread(
        target=lambda: result.update(out=asyncio.run(_run([(server, sock)], load, attach)))
    )
    thread.start()
    try:
        health = _get_when_up(f"http://127.0.0.1:{port}/health")
        assert health.status_code == 503 and health.json() == {"status": "loading"}
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30)
        assert models.status_code == 503 and models.json()["error"]["code"] == "model_loading"
        release.set()
        deadline = time.monotonic() + 60
        while httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).status_code == 200
    finally:
        release.set()
        server.should_exit = True
        thread.join(60)
        sock.close()
    assert result["out"] == (engine, None)


def _get_when_up(url: str) -> httpx.Response:
    deadline = time.monotonic() + 60
    while True:
        try:
            return httpx.get(url, timeout=30)
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def _start_stream(server) -> tuple[threading.Thread, dict, threading.Event]:
    """A long streamed completion read in a thread; returns once its first token arrived."""
    first, state = threading.Event(), {"chunks": 0, "ended": False}
    body = {"model": "tiny_chat", "prompt": "Hello", "max_tokens": 900, "ignore_eos": True}
    body["stream"] = True

    def read() -> None:
        try:
            with httpx.stream("POST", f"{server.v1}/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        json.loads(line[6:])
                        state["chunks"] += 1
                        first.set()
        except httpx.HTTPError:
            pass  # cut off by the shutdown: expected
        finally:
            state["ended"] = True
            first.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    assert first.wait(120) and state["chunks"] > 0
    return thread, state, first


def _refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return False
    except OSError:
        return True


@pytest.fixture
def lone_server(chat_model_dir, tmp_path):
    """A server of its own (these tests end it), with a short shutdown grace period."""
    s = start_server(
        chat_model_dir, tmp_path / "lone.log", "--max-model-len", "1024",
        "--shutdown-grace-s", str(GRACE_S),
    )  # fmt: skip
    yield s
    if s.process.poll() is None:
        s.process.kill()
        s.process.wait()


def test_sigterm_stops_accepting_and_exits_within_the_grace_period(lone_server):
    s = lone_server
    reader, state, _ = _start_stream(s)
    t0 = time.monotonic()
    s.process.send_signal(signal.SIGTERM)
    deadline = t0 + GRACE_S
    while not _refuses_connections(s.port):  # the listener closes first...
        assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
        time.sleep(0.02)
    chunks_then = state["chunks"]
    s.process.wait(timeout=GRACE_S + 30)
    elapsed = time.monotonic() - t0
    assert elapsed <= GRACE_S + 2, f"exited {elapsed:.1f} s after SIGTERM"
    reader.join(30)
    assert state["ended"]
    assert state["chunks"] >= chunks_then  # ...while the open stream went on until aborted
    assert s.process.returncode == 0, s.log.read_text()


def test_a_second_signal_exits_at_once(chat_model_dir, tmp_path):
    s = start_server(
        chat_model_dir, tmp_path / "twice.log", "--max-model-len", "1024",
        "--shutdown-grace-s", "600",
    )  # fmt: skip
    try:
        _start_stream(s)
        s.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not _refuses_connections(s.port):  # the first signal was handled
            assert time.monotonic() < deadline
            time.sleep(0.02)
        t0 = time.monotonic()
        s.process.send_signal(signal.SIGTERM)
        s.process.wait(timeout=30)
        assert time.monotonic() - t0 <= 2
        assert s.process.returncode == 128 + signal.SIGTERM
    finally:
        if s.process.poll() is None:
            s.process.kill()
            s.process.wait()
