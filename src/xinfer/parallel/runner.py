"""The two sides of a step under tensor parallelism. Rank 0's `TensorParallelModelRunner`
sends each step's inputs before running it (a look-ahead step's ids, still on the GPU, go
by a device broadcast); the followers' `follow` loop receives them and runs the same
`ModelRunner.logits` — the same graphs or eager code, so the same collectives in the same
order — and leaves sampling to rank 0 (the one place with the requests' random streams)."""

from __future__ import annotations

import logging

import torch

from xinfer.parallel.channel import (
    END_WARM_UP,
    RESET_STATS,
    STATS,
    STEP,
    STOP,
    StepChannel,
    unpack_batch,
)
from xinfer.runner.model_runner import HostBatch, ModelRunner

logger = logging.getLogger("xinfer")


class TensorParallelModelRunner(ModelRunner):
    def __init__(self, *args, channel: StepChannel, **kwargs) -> None:
        self.channel = channel
        super().__init__(*args, **kwargs)

    def logits(self, hb: HostBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor | None:
        self.channel.send_step(hb, input_ids)
        return super().logits(hb, input_ids)


def follow(engine, channel: StepChannel) -> None:
    """A follower's life after start-up: run rank 0's steps until it says stop."""
    runner, manager = engine.runner, engine.offload_manager
    while True:
        op, payload = channel.receive()
        if op == STEP:
            hb, has_device_ids = unpack_batch(payload)
            ids = None
            if has_device_ids:
                ids = torch.empty(len(hb.input_ids), dtype=torch.int64, device=engine.device)
                channel.group.broadcast_device(ids)
            runner.logits(hb, ids)
        elif op == STATS:
            channel.group.gather_objects(None if manager is None else manager.stats())
        elif op == RESET_STATS:
            if manager is not None:
                manager.reset_stats()
        elif op == END_WARM_UP:
            if engine.routing is not None:
                engine.routing.start()  # the routing model's per-request state, from now
        elif op == STOP:
            return
        else:
            raise RuntimeError(f"tensor-parallel follower: unknown message {op}")
