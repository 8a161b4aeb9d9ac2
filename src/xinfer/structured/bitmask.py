"""The token bitmask of one step's grammar rows, and its application to the logits: bit
`t % 32` of int32 word `t // 32` of a row says whether token t may come next. Only the grammar
rows are touched; a step without grammar rows never calls in here."""

from __future__ import annotations

import torch

from xinfer.structured.compiler import GrammarMatcher


def grammar_bitmask(
    matchers: list[GrammarMatcher | None], device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rows (R,) int64, bitmask (R, words) int32) on `device` for the rows of a step that
    have a matcher; None when no row has one. Copies to the GPU without a stream sync."""
    rows = [row for row, m in enumerate(matchers) if m is not None]
    if not rows:
        return None
    compiler = matchers[rows[0]].compiler  # one model, one compiler
    pinned = torch.device(device).type == "cuda"  # the caching host allocator keeps it alive
    host = torch.empty((len(rows), compiler.bitmask_words), dtype=torch.int32, pin_memory=pinned)
    compiler.fill_bitmask([matchers[row] for row in rows], host)
    row_ids = torch.tensor(rows, dtype=torch.int64, pin_memory=pinned)
    return row_ids.to(device, non_blocking=True), host.to(device, non_blocking=True)


def apply_token_bitmask(
    logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor
) -> torch.Tensor:
    """`logits` (B, V) with every token that row `rows[i]`'s mask forbids set to -inf (a new
    tensor; `logits` is not modified)."""
    num_vocab = logits.shape[-1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).bool().flatten(1)[:, :num_vocab]  # (R, V)
    masked = logits[rows].masked_fill(~allowed, float("-inf"))
    return logits.index_copy(0, rows, masked)
