"""The prompt pass: a prompt longer than one step's token budget runs layer by layer across
all its chunks, so that under offload each layer's experts are streamed once per prompt,
not once per chunk (offload/staging.py copies layer l+1 while layer l computes).

Each chunk is exactly the batch the chunked path would run alone (same tokens, positions,
KV slots and block table; the forward context of a one-request step), and each layer runs its
chunks in order, so every kernel call sees what it would see chunk by chunk: the result is
the same bits. Where a layer offers it, the chunks' routed-expert calls run as one
(runner/expert_merge.py; the same bits too). The scheduler cuts the pass into slices of
layers (engine/scheduler.py); the hidden states of all chunks live here between slices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from xinfer.engine.scheduler import ScheduledRequest
from xinfer.runner import expert_merge
from xinfer.runner.forward_context import forward_context


class LayerHooks(Protocol):
    """What runs around a slice's layers (the offload layer streamer; nothing when resident)."""

    def begin(self, layers: list[torch.nn.Module]) -> None: ...
    def enter(self, layer: int) -> None: ...
    def exit(self, layer: int) -> None: ...
    def end(self) -> None: ...


class NoHooks:
    """Resident experts: nothing to stream."""

    def begin(self, layers: list[torch.nn.Module]) -> None:
        pass

    def enter(self, layer: int) -> None:
        pass

    def exit(self, layer: int) -> None:
        pass

    def end(self) -> None:
        pass


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
        hooks: LayerHooks | None = None,
    ) -> None:
        """`chunk_inputs(s, start, n)`: StepInputs of a one-request step computing tokens
        [start, start + n) of `s.request`. Passes need the model's layer stack (`stack`;
        the engine schedules none without it)."""
        self.stack = model.layer_stack() if hasattr(model, "layer_stack") else None
        self.chunk_inputs, self.hooks = chunk_inputs, hooks or NoHooks()
        self.state: PassState | None = None

    def run(self, s: ScheduledRequest) -> torch.Tensor | None:
        """Run slice `s.prompt_pass`; after the last one, the final hidden state (1, H) of
        the pass's last token (None before)."""
        if self.stack is None:
            raise RuntimeError("this model offers no layer stack: it cannot run prompt passes")
        cut = s.prompt_pass
        if cut.index == 0:
            self.state = self._start(s)
        elif self.state is None or self.state.request_id != s.request.request_id:
            raise RuntimeError("a prompt pass slice arrived without the slices before it")
        state, hooks, layers = self.state, self.hooks, self.stack.layers
        lo = len(layers) * cut.index // cut.num_slices
        hi = len(layers) * (cut.index + 1) // cut.num_slices
        hooks.begin(list(layers[lo:hi]))
        try:
            for i, layer in enumerate(layers[lo:hi]):
                hooks.enter(i)
                block = expert_merge.mergeable_block(layer) if len(state.chunks) > 1 else None
                if block is not None:  # the chunks' routed-expert calls joined
                    expert_merge.run_layer(layer, block, state.chunks, state.hidden,
                                           state.residual)  # fmt: skip
                    hooks.exit(i)
                    continue
                for c, inp in enumerate(state.chunks):  # in order: each sees the KV before it
                    with forward_context(inp.ctx):
                        state.hidden[c], state.residual[c] = layer(
                            inp.positions, state.hidden[c], state.residual[c]
                        )
                hooks.exit(i)
        finally:
            hooks.end()
        if not cut.is_last:
            return None
        self.state = None
        inp = state.chunks[-1]
        with forward_context(inp.ctx):
            hidden, _ = self.stack.final_norm(state.hidden[-1], state.residual[-1])
        return hidden[inp.logits_indices]

    def _start(self, s: ScheduledRequest) -> PassState:
        cut, chunk = s.prompt_pass, s.prompt_pass.chunk_tokens
        starts = range(s.start, s.start + cut.num_tokens, chunk)
        end = s.start + cut.num_tokens
        chunks = [self.chunk_inputs(s, a, min(chunk, end - a)) for a in starts]
        state = PassState(s.request.request_id, chunks)
        state.hidden = [self.stack.embed(inp.input_ids) for inp in chunks]
        state.residual = [None] * len(chunks)
        return state
