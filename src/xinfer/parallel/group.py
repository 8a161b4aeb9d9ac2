"""This process's tensor-parallel group: its rank, size and device, and the collectives the
model wrapper and the step channel use — all-reduce, all-gather and broadcast on the device
group (NCCL on GPUs, gloo on CPUs), control messages on a gloo group. A collective that
fails (a peer died) ends the run through `on_failure`, with a message, instead of a traceback."""

from __future__ import annotations

import datetime
import gc
import os
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.distributed as dist

from xinfer.config import ModelConfig
from xinfer.parallel.plan import rank_config

# Followers wait on the control group between steps for as long as rank 0 idles (a server
# may idle for days); a dead peer is noticed at once anyway (its sockets close).
_IDLE_TIMEOUT = datetime.timedelta(days=3650)
# `all_gather_single` replaces `all_gather_into_tensor` in newer torch (same arguments).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_THREADS_BEFORE: int | None = None  # torch's CPU threads before a CPU group took its share


class TensorParallelGroup:
    def __init__(
        self,
        rank: int,
        size: int,
        device: torch.device,
        cpu_group: dist.ProcessGroup,
        launcher: str,
        on_failure: Callable[[str], None],
    ) -> None:
        self.rank, self.size, self.device = rank, size, device
        self.cpu_group, self.launcher = cpu_group, launcher
        self.on_failure = on_failure
        self.full_config: ModelConfig | None = None  # unsharded; set by `shard_config`

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def shard_config(self, cfg: ModelConfig) -> ModelConfig:
        """This rank's model config (heads and intermediate sizes divided); keeps `cfg`."""
        self.full_config = cfg
        return rank_config(cfg, self.size)

    def failed(self, what: str, e: RuntimeError) -> None:
        """gloo: "Connection closed by peer"; NCCL: errors, aborts — a peer is gone."""
        cause = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        self.on_failure(f"tensor-parallel rank {self.rank}: {what} failed ({cause})")

    @contextmanager
    def _guard(self, what: str):
        try:
            yield
        except RuntimeError as e:
            self.failed(what, e)
            raise

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks in place (every rank gets the same bits) and return it.
        (Inline try: this one runs twice per layer of every eager step.)"""
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            self.failed("all-reduce", e)
            raise
        return t

    def all_gather_columns(self, t: torch.Tensor) -> torch.Tensor:
        """(T, n) per rank → (T, size * n): rank r's columns at [r*n, (r+1)*n)."""
        rows, n = t.shape
        out = torch.empty(self.size * rows, n, dtype=t.dtype, device=t.device)
        with self._guard("all-gather"):
            _all_gather(out, t.contiguous())
        return out.view(self.size, rows, n).permute(1, 0, 2).reshape(rows, self.size * n)

    def broadcast_device(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's `t` into every rank's `t` (device group: stays on the GPU stream)."""
        with self._guard("broadcast"):
            dist.broadcast(t, 0)
        return t

    def broadcast_control(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's host tensor into every rank's (the control group)."""
        with self._guard("control broadcast"):
            dist.broadcast(t, 0, group=self.cpu_group)
        return t

    def agree_min(self, values: list[int]) -> list[int]:
        """The element-wise minimum over the ranks (sizes every rank must share)."""
        t = torch.tensor(values, dtype=torch.int64)
        with self._guard("agreement"):
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return t.tolist()

    def gather_objects(self, obj: object) -> list[object] | None:
        """Every rank's `obj` on rank 0 (None elsewhere), over the control group."""
        out = [None] * self.size if self.is_first else None
        with self._guard("gather"):
            dist.gather_object(obj, out, dst=0, group=self.cpu_group)
        return out


def init_group(
    rank: int,
    size: int,
    device: torch.device,
    launcher: str,
    on_failure: Callable[[str], None],
    store: dist.Store | None = None,
) -> TensorParallelGroup:
    """Join the process group (`store`, or torchrun's env:// rendezvous) and warm it up, so
    that NCCL's communicator exists before any CUDA graph captures a collective."""
    kw: dict = {"rank": rank, "world_size": size}
    kw.update({"store": store} if store is not None else {"init_method": "env://"})
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, **kw)
        cpu_group = dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT)
    else:
        # CPU ranks share the host's cores: each takes its share, or their OpenMP threads
        # spin against each other and every collective waits for a descheduled peer.
        global _THREADS_BEFORE
        _THREADS_BEFORE = torch.get_num_threads()
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
        dist.init_process_group("gloo", timeout=_IDLE_TIMEOUT, **kw)
        cpu_group = dist.group.WORLD
    group = TensorParallelGroup(rank, size, device, cpu_group, launcher, on_failure)
    group.all_reduce(torch.ones(1, device=device))
    group.agree_min([0])
    return group


_CURRENT: TensorParallelGroup | None = None


def current_group() -> TensorParallelGroup | None:
    """The group of this process, or None without tensor parallelism."""
    return _CURRENT


def set_current_group(group: TensorParallelGroup | None) -> None:
    global _CURRENT
    _CURRENT = group


def destroy_group() -> None:
    """Leave the process group (after the last collective of the run)."""
    global _THREADS_BEFORE
    group = current_group()
    set_current_group(None)
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if dist.is_initialized() and group is not None and group.device.type == "cuda" and abort:
        abort()  # ncclCommDestroy can hang once graphs captured collectives (pytorch#115388)
    elif dist.is_initialized():
        dist.destroy_process_group()
    if group is not None:
        # The group's gloo worker threads end only when the last reference to it goes; one
        # that outlives the interpreter's finalization drops a finished collective's tensors
        # without the GIL and aborts the process ("terminate called without an active
        # exception"). Drop ours and collect now, while Python can still take them.
        group.cpu_group = None
        del group
        gc.collect()
    if _THREADS_BEFORE is not None:
        torch.set_num_threads(_THREADS_BEFORE)
        _THREADS_BEFORE = None
