"""The forward context's view that routing sources need: each sequence's token range,
length, per-request state row and request key (see runner/request_slots.py)."""

from __future__ import annotations

from xinfer.routing.parametric_ops import SequenceBatch
from xinfer.runner.forward_context import ForwardContext


def sequence_batch(ctx: ForwardContext) -> SequenceBatch:
    if ctx.request_rows is None or ctx.request_keys is None:
        raise RuntimeError(
            "this routing source needs per-request state rows in the forward context; "
            "run the model through the ModelRunner"
        )
    return SequenceBatch(
        ctx.query_start_loc, ctx.seq_lens, ctx.request_rows, ctx.request_keys, ctx.is_decode
    )
