"""Replay of a recorded routing trace as a routing source. Each recorded request becomes a
stream of routed ids by position; a live request replays stream `key mod S` (its key is the
order in which the engine saw it): position p takes the stream's entry (p − first) mod P,
so a request longer than the stream wraps around. The streams sit in one device table, so
a step is a few gathers per layer, inside CUDA graphs."""

from __future__ import annotations

import numpy as np
import torch

from xinfer.errors import UserError
from xinfer.routing.batch import sequence_batch
from xinfer.routing.parametric_ops import token_layout, weights_at
from xinfer.routing.trace import read_trace, request_streams
from xinfer.runner.forward_context import ForwardContext


class ReplayRouting:
    def __init__(
        self, path: str, num_experts: list[int], top_k: list[int], device: torch.device
    ) -> None:
        header, steps = read_trace(path)
        num_layers = len(num_experts)
        if header.num_layers != num_layers or set(top_k) != {header.top_k}:
            raise UserError(
                f"routing trace {path!r} has {header.num_layers} MoE layers of top-"
                f"{header.top_k}; this model has {num_layers} of top-{max(top_k, default=0)}"
            )
        streams = request_streams(steps)
        if not streams:
            raise UserError(f"routing trace {path!r} holds no complete request to replay")
        table = np.concatenate([ids for _, _, ids in streams], axis=1)  # (L, N, k)
        if table.min() < 0 or table.max() >= min(num_experts):
            raise UserError(
                f"routing trace {path!r} routes to expert {int(table.max())}; this model has "
                f"{min(num_experts)} experts per layer"
            )
        lengths = [ids.shape[1] for _, _, ids in streams]
        self.num_streams = len(streams)
        self.stream_ids = [rid for rid, _, _ in streams]
        self.firsts = torch.tensor([first for _, first, _ in streams], dtype=torch.int64).to(device)
        self.table = torch.from_numpy(table.astype(np.int32)).to(device)  # (L, N, k)
        self.lengths = torch.tensor(lengths, dtype=torch.int64, device=device)
        self.offsets = torch.tensor(np.cumsum([0] + lengths[:-1]), dtype=torch.int64).to(device)
        self._rows_for: tuple[ForwardContext, torch.Tensor] | None = None

    def reset(self) -> None:
        self._rows_for = None

    def _rows(self, layer: int, ctx: ForwardContext, num_tokens: int) -> torch.Tensor:
        """(T,) table row of every token, computed by each forward's first MoE layer (layer 0
        runs first in every forward, a graph capture included) and reused by the others."""
        if layer != 0 and self._rows_for is not None and self._rows_for[0] is ctx:
            return self._rows_for[1]
        batch = sequence_batch(ctx)
        seq, positions = token_layout(batch, num_tokens)
        stream = batch.keys[seq].clamp_min(0) % self.num_streams
        into = torch.remainder(positions - self.firsts[stream], self.lengths[stream])
        rows = self.offsets[stream] + into
        self._rows_for = (ctx, rows)
        return rows

    def route(
        self,
        layer: int,
        router_logits: torch.Tensor,
        ctx: ForwardContext,
        top_k: int,
        renormalize: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.table[layer].index_select(0, self._rows(layer, ctx, router_logits.shape[0]))
        return weights_at(router_logits, ids, renormalize), ids
