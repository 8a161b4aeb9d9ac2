"""Recording of the routed ids: each MoE layer copies its (T, k) ids into one device buffer
(L, max_tokens, k) int16 — a copy inside the forward, so CUDA graphs capture it; after the
forward the runner has the step's slice copied to pinned host memory without waiting, and
after the step (whose sampled tokens it waited for anyway) the record is appended to the
trace file (routing/trace.py). Steps that sample nothing wait for their copy there."""

from __future__ import annotations

import torch

from xinfer.routing.trace import TraceHeader, TraceWriter


class RoutingRecorder:
    def __init__(
        self,
        path: str,
        header: TraceHeader,
        max_tokens: int,
        device: torch.device,
    ) -> None:
        self.header, self.device = header, device
        self.buffer = torch.zeros(
            header.num_layers, max_tokens, header.top_k, dtype=torch.int16, device=device
        )
        self.writer = TraceWriter(path, header)
        self.is_active = False  # off during the engine's warm-up
        self._pending: list[tuple[list[tuple[str, int, int]], torch.Tensor, object]] = []

    def write(self, layer: int, ids: torch.Tensor) -> None:
        """In the forward: layer `layer` routed `ids` (T, k)."""
        self.buffer[layer, : ids.shape[0]].copy_(ids)

    def after_forward(self, requests: list[tuple[str, int, int]]) -> None:
        """After a forward over these sequences (request id, first position, tokens): start
        the copy of its ids to the host."""
        if not self.is_active:
            return
        num_tokens = sum(n for _, _, n in requests)
        is_cuda = self.device.type == "cuda"
        host = torch.empty(
            self.header.num_layers, num_tokens, self.header.top_k,
            dtype=torch.int16, pin_memory=is_cuda,
        )  # fmt: skip
        host.copy_(self.buffer[:, :num_tokens], non_blocking=is_cuda)
        event = None
        if is_cuda:
            event = torch.cuda.Event()
            event.record()
        self._pending.append((requests, host, event))

    def after_step(self) -> None:
        """Append every copied record to the file (waits for copies still running)."""
        for requests, host, event in self._pending:
            if event is not None:
                event.synchronize()
            self.writer.write(requests, host.numpy())
        self._pending.clear()

    def close(self) -> None:
        self.after_step()
        self.writer.close()
