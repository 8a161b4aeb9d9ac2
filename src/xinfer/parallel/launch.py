"""Starting and watching the ranks of one host. Rank 0 (the process the user started)
starts `python -m xinfer.parallel.worker` once per other rank, hands each its config on
stdin and keeps that pipe open: a follower whose stdin closes without the stop byte knows
rank 0 died. Rank 0 watches its followers the same way (a thread waits on each). Either
way the survivors print one line and exit within a second, instead of hanging in a
collective (NCCL never notices a dead peer by itself)."""

from __future__ import annotations

import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace

from xinfer.config import EngineConfig

logger = logging.getLogger("xinfer")
STOP_BYTE = b"S"  # written to a follower's stdin before rank 0 closes it on purpose
_STOP_WAIT_S = 10.0


@dataclass(frozen=True)
class WorkerArgs:
    """What a spawned follower needs: its config (its device, its rank) and where to meet."""

    config: EngineConfig
    store_port: int
    log_level: str


def fail(message: str, code: int = 1) -> None:
    """End this process now, with one line on stderr (the other threads may be blocked in
    a collective that will never complete)."""
    try:
        sys.stderr.write(f"xinfer: error: {message}\n")
        sys.stderr.flush()
    finally:
        os._exit(code)


class FollowerProcesses:
    """Rank 0's handle on the follower processes it started."""

    def __init__(self, config: EngineConfig, store_port: int) -> None:
        self.is_stopping = False
        self.procs: list[subprocess.Popen] = []
        par = config.parallel
        for rank in range(1, par.size):
            self.procs.append(self._start(config, rank, store_port))
        for rank, proc in enumerate(self.procs, start=1):
            device = par.devices[rank]
            logger.info("tensor parallel: rank %d on %s started (pid %d)", rank, device, proc.pid)
            threading.Thread(
                target=self._watch, args=(rank, device, proc), daemon=True, name=f"tp-watch-{rank}"
            ).start()

    @staticmethod
    def _start(config: EngineConfig, rank: int, store_port: int) -> subprocess.Popen:
        par = config.parallel
        rank_config = replace(config, device=par.devices[rank], parallel=replace(par, rank=rank))
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        payload = pickle.dumps(WorkerArgs(rank_config, store_port, level))
        proc = subprocess.Popen(
            [sys.executable, "-m", "xinfer.parallel.worker"], stdin=subprocess.PIPE
        )
        proc.stdin.write(struct.pack("<Q", len(payload)) + payload)
        proc.stdin.flush()
        return proc

    def _watch(self, rank: int, device: str, proc: subprocess.Popen) -> None:
        code = proc.wait()
        if self.is_stopping:
            return
        for other in self.procs:
            if other is not proc and other.poll() is None:
                other.kill()
        how = "was killed" if code < 0 else f"exited with code {code}"
        fail(
            f"tensor-parallel rank {rank} ({device}) {how}; stopping every rank",
            code=2 if code == 2 else 1,  # a follower's user error stays a user error
        )

    def stop(self, has_said_stop: bool) -> None:
        """Deliberate shutdown: the followers were told to stop (or are killed)."""
        self.is_stopping = True
        for proc in self.procs:
            try:
                proc.stdin.write(STOP_BYTE)
                proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + (_STOP_WAIT_S if has_said_stop else 0.0)
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def watch_parent(stdin, rank: int) -> None:
    """A follower's watchdog thread: rank 0 closing our stdin without the stop byte means
    it died; then nobody will ever send the next step."""
    data = stdin.read(1)
    if data == STOP_BYTE:
        return
    fail(f"tensor-parallel rank {rank}: rank 0 exited; stopping")
