"""Real servers started through the CLI (`python -m xinfer.cli --m DIR ...`) in a
subprocess on free 127.0.0.1 ports: `start_server`, `stop_server` and the `Server` handle
(the fixtures in conftest.py and the lifecycle tests use them; a module of its own, not
conftest, so that `from conftest import` never finds another directory's conftest)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

SRC = Path(__file__).resolve().parents[2] / "src"


@dataclass
class Server:
    base: str  # http://127.0.0.1:PORT
    port: int
    api_key: str | None
    process: subprocess.Popen
    log: Path

    @property
    def v1(self) -> str:
        return f"{self.base}/v1"

    @property
    def ui(self) -> str:
        return f"http://127.0.0.1:{self.port + 1}/"

    def client(self, **kw):
        from openai import OpenAI

        return OpenAI(base_url=self.v1, api_key=self.api_key or "none", max_retries=0, **kw)

    def async_client(self, **kw):
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.v1, api_key=self.api_key or "none", max_retries=0, **kw)

    def metrics(self) -> dict[str, float]:
        """The unlabelled-or-labelled sample lines of /metrics, name{labels} → value."""
        text = httpx.get(f"{self.base}/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def _free_port_pair() -> int:
    """A port P such that P and P + 1 are both free now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free pair of ports")


def start_server(model: Path, log: Path, *extra: str, api_key: str | None = None) -> Server:
    port = _free_port_pair()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("XINFER_API_KEY", None)
    env["XINFER_LOG_LEVEL"] = "WARNING"
    cmd = [sys.executable, "-m", "xinfer.cli", "--m", str(model), "--d", "cpu"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny_chat", *extra]
    if api_key:
        cmd += ["--api-key", api_key]
    handle = log.open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=handle, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return Server(base, port, api_key, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"server did not become healthy:\n{log.read_text()}")


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
