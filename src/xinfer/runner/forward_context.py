"""Per-step batch metadata that layers read during a forward pass, so that model files keep
a plain `forward(input_ids, positions)` signature (nano-vllm's idea)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class ForwardContext:
    """Tokens of all sequences are packed back to back (T tokens, B sequences)."""

    slot_mapping: torch.Tensor  # (T,) int64 flat KV slot of each new token; -1 = padding
    block_tables: torch.Tensor  # (B, max_blocks) int32
    seq_lens: torch.Tensor  # (B,) int32 tokens in cache after this step
    query_start_loc: torch.Tensor  # (B+1,) int32 offsets of each sequence's new tokens
    max_query_len: int  # host-side: 1 for a pure decode step
    max_seq_len: int  # host-side upper bound of seq_lens (graphs: the captured bound)
    # (B,) int32 recurrent-state slot of each sequence (linear-attention layers); -1 = padding
    state_ids: torch.Tensor | None = None
    # Per-request device state (runner/request_slots.py): each sequence's row and its
    # request's key (the order the engine first saw it; -1 = a graph's padding row).
    request_rows: torch.Tensor | None = None  # (B,) int64
    request_keys: torch.Tensor | None = None  # (B,) int64

    @property
    def is_decode(self) -> bool:
        return self.max_query_len == 1


_CONTEXT: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    if _CONTEXT is None:
        raise RuntimeError("no forward context is set; run the model through the ModelRunner")
    return _CONTEXT


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    global _CONTEXT
    prev, _CONTEXT = _CONTEXT, ctx
    try:
        yield ctx
    finally:
        _CONTEXT = prev
