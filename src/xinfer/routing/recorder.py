"""Recording of the routed ids: each MoE layer copies its (T, k) ids into one device buffer
(L, max_tokens, k) int16 — a copy inside the forward, so CUDA graphs capture it; after the
forward the runner has the step's slice copied to pinned host memory without waiting, and
after the step (whose sampled tokens it waited for anyway) the record is appended to the
trace file (routing/trace.py). Steps that sample nothing wait for their copy there.

A prompt pass (runner/prompt_pass.py) runs a long prompt layer by layer over its chunks,
across several engine steps: its chunks write into a buffer of their own, at their offset
(known by their forward context), and the whole prompt becomes one record when its last
slice has run."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from xinfer.routing.trace import TraceHeader, TraceWriter
from xinfer.runner.forward_context import ForwardContext, get_forward_context


@dataclass
class _Pass:
    """The prompt pass being recorded: its chunks' contexts and their token offsets."""

    request_id: str
    first: int  # position of the first chunk's first token
    contexts: list[ForwardContext] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    num_tokens: int = 0
    buffer: torch.Tensor | None = None  # (L, num_tokens, k), made at the first write


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
        self._pass: _Pass | None = None

    def write(self, layer: int, ids: torch.Tensor) -> None:
        """In the forward: layer `layer` routed `ids` (T, k)."""
        buffer, offset = self.buffer, 0
        if self._pass is not None:
            ctx = get_forward_context()
            chunk = next((i for i, c in enumerate(self._pass.contexts) if c is ctx), None)
            if chunk is not None:
                buffer, offset = self._pass_buffer(), self._pass.offsets[chunk]
        buffer[layer, offset : offset + ids.shape[0]].copy_(ids)

    def pass_chunk(self, ctx: ForwardContext, request_id: str, start: int, n: int) -> None:
        """A prompt pass's chunk (tokens [start, start + n) of `request_id`) will run with
        `ctx`; chunks are announced in order before the pass's first layer runs."""
        p = self._pass
        continues = p is not None and p.request_id == request_id
        if not continues or start != p.first + p.num_tokens:  # a new (or restarted) pass
            p = self._pass = _Pass(request_id, start)
        p.contexts.append(ctx)
        p.offsets.append(p.num_tokens)
        p.num_tokens += n

    def _pass_buffer(self) -> torch.Tensor:
        p = self._pass
        if p.buffer is None:
            h = self.header
            p.buffer = torch.zeros(h.num_layers, p.num_tokens, h.top_k, dtype=torch.int16,
                                   device=self.device)  # fmt: skip
        return p.buffer

    def end_pass(self) -> None:
        """The pass's last slice has run: its whole prompt becomes one record."""
        p, self._pass = self._pass, None
        if p is not None and p.buffer is not None:
            self._copy_out([(p.request_id, p.first, p.num_tokens)], p.buffer)

    def after_forward(self, requests: list[tuple[str, int, int]]) -> None:
        """After a forward over these sequences (request id, first position, tokens): start
        the copy of its ids to the host."""
        num_tokens = sum(n for _, _, n in requests)
        self._copy_out(requests, self.buffer[:, :num_tokens])

    def _copy_out(self, requests: list[tuple[str, int, int]], ids: torch.Tensor) -> None:
        if not self.is_active:
            return
        is_cuda = self.device.type == "cuda"
        host = torch.empty(ids.shape, dtype=torch.int16, pin_memory=is_cuda)
        host.copy_(ids, non_blocking=is_cuda)
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
