"""The prompt pass: a prompt longer than one step's token budget runs layer by layer across
all its chunks, so that under offload each layer's experts are streamed once per prompt,
not once per chunk (offload/staging.py copies layer l+1 while layer l computes).

Each chunk is exactly the batch the chunked path would run alone (same tokens, positions,
KV slots and block table; the forward context of a one-request step), and each layer runs its
chunks in order, so every kernel call sees what it would see chunk by chunk: the result is
the same bits. The scheduler cuts the pass into slices of layers (engine/scheduler.py); the
hidden states of all chunks live here between slices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from xinfer.engine.scheduler import ScheduledRequest
from xinfer.runner.forward_context import forward_context


class LayerHooks(Protocol):
    """What runs around a slice's layers (the offload layer streamer; nothing when resident)."""

    def begin(self, layers: list[torch.nn.Module]) -> None: ...
    def enter(self, layer: int) -> None: ...
    def exit(self, layer: int) -> None: ...
    def end(self) -> None: ...


@dataclass
class PassState:
    request_id: str
    chunks: list  # StepInputs of each chunk, in order
    hidden: list[torch.Tensor] = field(default_factory=list)  # per chunk (n, H)
    residual: list[torch.Tensor | None] = field(default_factory=list)


class PromptPassRunner:
    """Runs the slices of one prompt pass at a time for a ModelRunner."""

    def __init__(
        self,
        model: torch.nn.Module,
        chunk_inputs: Callable[[ScheduledRequest, int, int], object],
        forward: Callable[[object], torch.Tensor],
        hooks: LayerHooks | None = None,
    ) -> None:
        """`chunk_inputs(s, start, n)`: StepInputs of a one-request step computing tokens
        [start, start + n) of `s.request`; `forward(inputs)`: the whole model on them (for
        models without a layer stack)."""
        self.stack = model.layer_stack() if hasattr(model, "layer_stack") else None
        self.chunk_inputs, self.forward, self.hooks = chunk_inputs, forward, hooks
        self.state: PassState | None = None

    def run(self, s: ScheduledRequest) -> torch.Tensor | None:
        """Run slice `s.prompt_pass`; after the last one, the final hidden state (1, H) of
        the pass's last token (None before)."""
        cut = s.prompt_pass
        if cut.index == 0:
            self.state = self._start(s)
        elif self.state is None or self.state.request_id != s.request.request_id:
            raise RuntimeError("a prompt pass slice arrived without the slices before it")
        state = self.state
        if self.stack is None:  # no layer stack: the chunks run whole, in the last slice
            out = None
            if cut.is_last:
                for inp in state.chunks:
                    hidden = self.forward(inp)
                out = hidden[state.chunks[-1].logits_indices]
            return self._finish(cut, out)
        layers = self.stack.layers
        lo = len(layers) * cut.index // cut.num_slices
        hi = len(layers) * (cut.index + 1) // cut.num_slices
        if self.hooks is not None:
            self.hooks.begin(list(layers[lo:hi]))
        try:
            for i, layer in enumerate(layers[lo:hi]):
                if self.hooks is not None:
                    self.hooks.enter(i)
                for c, inp in enumerate(state.chunks):
                    with forward_context(inp.ctx):
                        state.hidden[c], state.residual[c] = layer(
                            inp.positions, state.hidden[c], state.residual[c]
                        )
                if self.hooks is not None:
                    self.hooks.exit(i)
        finally:
            if self.hooks is not None:
                self.hooks.end()
        out = None
        if cut.is_last:
            inp = state.chunks[-1]
            with forward_context(inp.ctx):
                hidden, _ = self.stack.final_norm(state.hidden[-1], state.residual[-1])
            out = hidden[inp.logits_indices]
        return self._finish(cut, out)

    def _start(self, s: ScheduledRequest) -> PassState:
        cut, chunk = s.prompt_pass, s.prompt_pass.chunk_tokens
        starts = range(s.start, s.start + cut.num_tokens, chunk)
        end = s.start + cut.num_tokens
        chunks = [self.chunk_inputs(s, a, min(chunk, end - a)) for a in starts]
        state = PassState(s.request.request_id, chunks)
        if self.stack is not None:
            state.hidden = [self.stack.embed(inp.input_ids) for inp in chunks]
            state.residual = [None] * len(chunks)
        return state

    def _finish(self, cut, out: torch.Tensor | None) -> torch.Tensor | None:
        if cut.is_last:
            self.state = None
        return out
