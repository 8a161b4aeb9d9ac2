"""The xinfer server under test: started as a subprocess on a free port with its log in a
file, polled until /health answers, stopped with SIGTERM; the counters of its Prometheus
/metrics text; the KV size and GPU expert share from its startup log; and a poller of
`nvidia-smi` for the peak GPU memory while it runs."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_KV_LOG = re.compile(r"KV cache: (\d+) tokens")
_EXPERTS_LOG = re.compile(r"MoE offload: (\d+) of (\d+) experts per layer")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample lines `name{labels} value [timestamp]` → {"name{labels}": value}; comments,
    blank and malformed lines are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        except ValueError:
            continue
    return out


def metric_total(samples: dict[str, float], name: str) -> float | None:
    """Sum of every sample of `name` (any labels), also found under `name_total`."""
    found = None
    for key, value in samples.items():
        bare = key.split("{", 1)[0]
        if bare in (name, f"{name}_total"):
            found = (found or 0.0) + value
    return found


def expert_counters(samples: dict[str, float]) -> dict[str, float] | None:
    """hits / misses / bytes of the expert cache from /metrics (bytes: what misses and
    prefetch copied into slots, both crossing the link); None without offload."""
    keys = ("hits", "misses", "bytes", "prefetch_bytes")
    out = {k: metric_total(samples, f"xinfer_expert_cache_{k}") for k in keys}
    if all(v is None for v in out.values()):
        return None
    out = {k: v or 0.0 for k, v in out.items()}
    out["bytes"] += out.pop("prefetch_bytes")
    return out


def parse_startup_log(text: str) -> dict[str, int | None]:
    kv = _KV_LOG.findall(text)
    experts = _EXPERTS_LOG.findall(text)
    return {
        "kv_tokens": int(kv[-1]) if kv else None,
        "gpu_experts": int(experts[-1][0]) if experts else None,
        "num_experts": int(experts[-1][1]) if experts else None,
    }


class ServerProcess:
    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path, port: int) -> None:
        self.cmd, self.log_path, self.port = cmd, log_path, port
        self.base = f"http://127.0.0.1:{port}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("wb")
        self.t_start = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 8) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds from process start to the first 200 from /health; raises RuntimeError
        when the process exits first or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with code {self.proc.returncode}")
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return time.perf_counter() - self.t_start
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server did not answer /health within {timeout_s:.0f} s")

    def metrics(self) -> dict[str, float]:
        return parse_prometheus(httpx.get(f"{self.base}/metrics", timeout=30).text)

    def stats(self) -> dict | None:
        try:
            r = httpx.get(f"{self.base}/v1/xinfer/stats", timeout=30)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM, wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def gpu_index(device: str | None) -> str:
    """The nvidia-smi index for --device (a GPU number), else the first visible GPU."""
    if device and device.isdigit():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        return ids[int(device)] if int(device) < len(ids) else device
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


def nvidia_smi(query: str, index: str) -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", index],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None


class GpuMemoryPoller:
    """Polls memory.used (MiB) every `interval_s` in a thread; `peak_mib` is None where
    nvidia-smi is missing (CPU runs)."""

    def __init__(self, index: str, interval_s: float = 0.25) -> None:
        self.index, self.interval_s = index, interval_s
        self.idle_mib = self._read()
        self.peak_mib: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> float | None:
        value = nvidia_smi("memory.used", self.index)
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None

    def _run(self) -> None:
        while not self._stop.is_set():
            used = self._read()
            if used is not None:
                self.peak_mib = max(self.peak_mib or 0.0, used)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> GpuMemoryPoller:
        if self.idle_mib is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
