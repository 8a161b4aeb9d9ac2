"""The engine's handle on tensor parallelism. `start_tensor_parallel(config, engine)` (None
with one device) starts the ranks (or joins them, in a follower); the `TensorParallelRun` it
returns gives the engine its rank's model config, the sizes every rank must share (KV
blocks, CUDA-graph batch sizes), the runner, the offload stats of all ranks, the followers'
loop, and the shutdown."""

from __future__ import annotations

import atexit
import datetime
import functools
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.distributed as dist

from xinfer.config import EngineConfig, ModelConfig
from xinfer.errors import UserError
from xinfer.parallel.channel import END_WARM_UP, STOP, StepChannel
from xinfer.parallel.group import (
    TensorParallelGroup,
    current_group,
    destroy_group,
    init_group,
    set_current_group,
)
from xinfer.parallel.launch import FollowerProcesses, fail
from xinfer.parallel.plan import rank_config
from xinfer.parallel.runner import TensorParallelModelRunner, follow
from xinfer.parallel.stats import TensorParallelOffloadView
from xinfer.runner.model_runner import ModelRunner

logger = logging.getLogger("xinfer")
_RENDEZVOUS_TIMEOUT = datetime.timedelta(seconds=120)
_RUN: TensorParallelRun | None = None  # rank 0's current run in this process


class TensorParallelRun:
    def __init__(
        self, group: TensorParallelGroup, followers: FollowerProcesses | None, engine
    ) -> None:
        self.group, self.followers = group, followers
        self.channel = StepChannel(group)
        self.engine_ref = weakref.ref(engine)
        self.is_following = False  # rank 0: the followers wait for steps (may be told to stop)
        self.is_closed = False

    @property
    def is_first(self) -> bool:
        return self.group.is_first

    @property
    def size(self) -> int:
        return self.group.size

    def shard_config(self, cfg: ModelConfig) -> ModelConfig:
        return self.group.shard_config(cfg)

    def rank_engine_config(self, config: EngineConfig) -> EngineConfig:
        """A follower's options: it records no routing trace (rank 0 writes the one file)
        but keeps rank 0's look-ahead decision, which recording turns off."""
        if self.is_first or config.routing.record_path is None:
            return config
        routing = replace(config.routing, record_path=None)
        return replace(config, routing=routing, decode_look_ahead=False)

    def end_warm_up(self) -> None:
        """Rank 0, after its warm-up steps: the followers reset what rank 0 resets."""
        if self.is_first:
            self.channel.send(END_WARM_UP)

    def agree_min(self, count: int) -> int:
        """The smallest of every rank's `count` (KV blocks, state slots: rank 0's ids index
        every rank's cache, so the smallest one wins)."""
        return self.group.agree_min([count])[0]

    def agree_graph_sizes(
        self, is_graph_safe: Callable[[int], bool] | None, max_num_seqs: int
    ) -> Callable[[int], bool]:
        """A batch size is captured only where every rank can capture it (a graph holds
        collectives: all ranks must replay, or all run eagerly, the same steps)."""
        from xinfer.runner.cuda_graph import capture_sizes

        sizes = capture_sizes(max_num_seqs)
        local = [1 if is_graph_safe is None or is_graph_safe(b) else 0 for b in sizes]
        agreed = {b for b, ok in zip(sizes, self.group.agree_min(local)) if ok}
        return agreed.__contains__

    def runner_class(self) -> type | Callable:
        if self.is_first:
            return functools.partial(TensorParallelModelRunner, channel=self.channel)
        return ModelRunner

    def offload_view(self, manager):
        if manager is None or not self.is_first:
            return manager
        return TensorParallelOffloadView(manager, self.channel)

    def start_following(self, engine) -> None:
        """Called where the followers' engines are built: rank 0 may now send steps; a
        follower runs them until rank 0 stops, then ends its process."""
        if self.is_first:
            self.is_following = True
            return
        try:
            follow(engine, self.channel)
        finally:
            destroy_group()
        raise SystemExit(0)

    def close(self) -> None:
        """Rank 0: tell the followers to stop, wait for them, leave the group."""
        global _RUN
        if self.is_closed or not self.is_first:
            return
        self.is_closed = True
        if _RUN is self:
            _RUN = None
        atexit.unregister(self.close)
        said_stop = False
        if self.is_following:
            try:
                self.channel.send(STOP)
                said_stop = True
            except RuntimeError:
                pass
        if self.followers is not None:
            self.followers.stop(said_stop)
        destroy_group()


def _rank0_failure(message: str) -> None:
    time.sleep(1.0)  # a follower's watchdog names the rank that died, if one did
    fail(message)


def _close_stale_run() -> None:
    """A run whose engine never finished starting, or was dropped unclosed, is closed; a
    live one is an error (one tensor-parallel engine per process)."""
    if _RUN is None:
        return
    if _RUN.is_following and _RUN.engine_ref() is not None:
        raise UserError(
            "a tensor-parallel engine is already running in this process; call its close() "
            "before starting another"
        )
    _RUN.close()


def _check_before_start(config: EngineConfig, cfg: ModelConfig, dtype: torch.dtype) -> None:
    """Refuse what would fail on every rank, before any rank starts: sizes that do not
    divide, and (ranks on this host) host RAM too small for all the ranks' expert shards."""
    rank_config(cfg, config.parallel.size)
    if config.offload.is_enabled and cfg.is_moe:
        from xinfer.offload.host_store import check_host_ram, expert_host_bytes

        local_ranks = len(config.parallel.devices) or 1
        shard = expert_host_bytes(cfg, dtype) // config.parallel.size
        check_host_ram(shard * local_ranks, "the offloaded experts of this host's ranks")


def start_tensor_parallel(config: EngineConfig, engine) -> TensorParallelRun | None:
    """Start (rank 0, spawn), join (torchrun) or resume (a spawned follower) the ranks."""
    global _RUN
    par = config.parallel
    if not par.is_enabled:
        return None
    group = current_group()
    if group is not None and not group.is_first:  # a spawned follower: joined already
        return TensorParallelRun(group, None, engine)
    _close_stale_run()
    _check_before_start(config, engine.model_config, engine.dtype)
    device = torch.device(config.device)
    followers = None
    if par.launcher == "torchrun":
        if par.rank:  # rank 0 reports for every rank (a spawned follower does the same)
            logging.getLogger("xinfer").setLevel(logging.WARNING)
        on_failure = fail if par.rank else _rank0_failure
        group = init_group(par.rank, par.size, device, "torchrun", on_failure)
    else:
        store = dist.TCPStore(
            "127.0.0.1", 0, par.size, True, timeout=_RENDEZVOUS_TIMEOUT, wait_for_workers=False
        )
        followers = FollowerProcesses(config, store.port)
        try:
            group = init_group(0, par.size, device, "spawn", _rank0_failure, store=store)
        except BaseException:
            followers.stop(has_said_stop=False)
            raise
    set_current_group(group)
    run = TensorParallelRun(group, followers, engine)
    if run.is_first:
        _RUN = run
        atexit.register(run.close)
    logger.info(
        "tensor parallel: %d ranks (%s), this is rank %d on %s",
        par.size,
        "NCCL" if device.type == "cuda" else "gloo",
        par.rank,
        device,
    )
    return run
