"""Rank 0 → followers: one message per step over the control group. A message is an int64
tensor `[op, length, payload...]` of a fixed capacity (one broadcast for any decode step of
a usual size; a longer payload follows in a second broadcast). A step's payload is the
packed `HostBatch`, so every rank runs the same step on the same inputs."""

from __future__ import annotations

import numpy as np
import torch

from xinfer.parallel.group import TensorParallelGroup
from xinfer.runner.model_runner import HostBatch

STEP, STATS, RESET_STATS, STOP, END_WARM_UP = 1, 2, 3, 4, 5
_CAPACITY = 4096  # int64 words of the first broadcast (header included)
_HEADER = 2


_HEAD = 7  # T, B, S, max_query_len, has_device_ids, state ids, request rows


def pack_batch(hb: HostBatch, has_device_ids: bool) -> np.ndarray:
    """The header, then the lists back to back (block tables ragged: their lengths first).
    Request ids (strings) stay behind: only rank 0's routing recorder reads them."""
    num_tokens, num_seqs = len(hb.input_ids), len(hb.seq_lens)
    head = [num_tokens, num_seqs, len(hb.logits_indices), hb.max_query_len, int(has_device_ids)]
    head += [len(hb.state_ids), len(hb.request_rows)]
    table_lens = [len(t) for t in hb.block_tables]
    parts = [head, hb.input_ids, hb.positions, hb.slots, hb.seq_lens, hb.query_start_loc]
    parts += [hb.logits_indices, hb.state_ids, hb.request_rows, hb.request_keys]
    parts += [table_lens, *hb.block_tables]
    return np.fromiter((x for p in parts for x in p), dtype=np.int64)


def unpack_batch(words: np.ndarray) -> tuple[HostBatch, bool]:
    head = words[:_HEAD].tolist()
    num_tokens, num_seqs, num_sample, max_query_len, has_ids, num_states, num_rows = head
    pos = _HEAD

    def take(n: int) -> list[int]:
        nonlocal pos
        out = words[pos : pos + n].tolist()
        pos += n
        return out

    input_ids, positions, slots = take(num_tokens), take(num_tokens), take(num_tokens)
    seq_lens, query_start_loc = take(num_seqs), take(num_seqs + 1)
    logits_indices, state_ids = take(num_sample), take(num_states)
    request_rows, request_keys, table_lens = take(num_rows), take(num_rows), take(num_seqs)
    tables = [take(n) for n in table_lens]
    hb = HostBatch(
        input_ids, positions, slots, seq_lens, query_start_loc, logits_indices, tables,
        max_query_len, state_ids, request_rows=request_rows, request_keys=request_keys,
    )  # fmt: skip
    return hb, bool(has_ids)


class StepChannel:
    def __init__(self, group: TensorParallelGroup) -> None:
        self.group = group
        self.buffer = torch.zeros(_CAPACITY, dtype=torch.int64)

    def send(self, op: int, payload: np.ndarray | None = None) -> None:
        """Rank 0 only."""
        n = 0 if payload is None else len(payload)
        words = self.buffer.numpy()
        words[0], words[1] = op, n
        first = min(n, _CAPACITY - _HEADER)
        if first:
            words[_HEADER : _HEADER + first] = payload[:first]
        self.group.broadcast_control(self.buffer)
        if n > first:
            self.group.broadcast_control(torch.from_numpy(np.ascontiguousarray(payload[first:])))

    def receive(self) -> tuple[int, np.ndarray]:
        """Followers: block until rank 0's next message; (op, payload words)."""
        self.group.broadcast_control(self.buffer)
        words = self.buffer.numpy()
        op, n = int(words[0]), int(words[1])
        first = min(n, _CAPACITY - _HEADER)
        payload = words[_HEADER : _HEADER + first].copy()
        if n > first:
            rest = self.group.broadcast_control(torch.empty(n - first, dtype=torch.int64))
            payload = np.concatenate([payload, rest.numpy()])
        return op, payload

    def send_step(self, hb: HostBatch, device_ids: torch.Tensor | None) -> None:
        """Rank 0, before running a step: its inputs; a look-ahead step's input ids (still on
        the device) follow on the device group."""
        self.send(STEP, pack_batch(hb, device_ids is not None))
        if device_ids is not None:
            self.group.broadcast_device(device_ids)
