"""The routing trace file written by `--record-routing` and read by `replay:PATH`.

Layout (all little-endian):
  8 bytes   magic b"XRTRACE1"
  uint32    n, then n bytes of UTF-8 JSON: the header
            {"version": 1, "num_layers": L, "top_k": k, "num_experts": E, "model": "..."}
  then one record per engine step, until the end of the file:
  uint32    n, then n bytes of UTF-8 JSON: {"step": i, "requests": [[id, first, count], ...]}
            (the step's sequences in batch order: request id, position of its first token
            in this step, number of its tokens in this step)
  L·T·k     int16 expert ids, shape (L, T, k), T = the sum of the counts: layer-major, then
            the step's tokens back to back in request order, then the k routed experts in
            the router's order.
L counts MoE layers only (in model order). A prompt appears over one or more steps (its
chunks; a prompt pass as one record), then one token per step while it decodes; a
preempted request is recomputed, so its positions can appear again (the later record wins
on replay); a prompt prefix found in the prefix cache is not computed, so its positions do
not appear."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xinfer.errors import UserError

MAGIC = b"XRTRACE1"
VERSION = 1


@dataclass(frozen=True)
class TraceHeader:
    num_layers: int
    top_k: int
    num_experts: int
    model: str = ""


@dataclass(frozen=True)
class TraceStep:
    step: int
    requests: list[tuple[str, int, int]]  # (request id, first position, token count)
    ids: np.ndarray  # (L, T, k) int16


class TraceWriter:
    """Appends records; each is flushed at once, so a trace is readable while it grows and
    nothing is lost if the process ends without closing it."""

    def __init__(self, path: str | Path, header: TraceHeader) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = self.path.open("wb")
        except OSError as e:
            raise UserError(f"cannot write the routing trace {str(path)!r}: {e.strerror}") from None
        self.header = header
        self.num_steps = 0
        self._chunk({"version": VERSION, **header.__dict__}, MAGIC)

    def _chunk(self, meta: dict, prefix: bytes = b"", payload: bytes = b"") -> None:
        text = json.dumps(meta, separators=(",", ":")).encode()
        self.file.write(prefix + struct.pack("<I", len(text)) + text + payload)
        self.file.flush()

    def write(self, requests: list[tuple[str, int, int]], ids: np.ndarray) -> None:
        """`ids` (L, T, k) int16 for the step's T tokens."""
        h = self.header
        num_tokens = sum(n for _, _, n in requests)
        if ids.shape != (h.num_layers, num_tokens, h.top_k) or ids.dtype != np.int16:
            raise ValueError(f"trace record ids {ids.shape} {ids.dtype} do not match the header")
        meta = {"step": self.num_steps, "requests": [list(r) for r in requests]}
        self._chunk(meta, payload=np.ascontiguousarray(ids).astype("<i2").tobytes())
        self.num_steps += 1

    def close(self) -> None:
        if not self.file.closed:
            self.file.close()


def _read_chunk(f, path: Path) -> tuple[dict, int] | None:
    raw = f.read(4)
    if not raw:
        return None
    if len(raw) < 4:
        raise UserError(f"routing trace {str(path)!r} ends inside a record")
    (n,) = struct.unpack("<I", raw)
    text = f.read(n)
    if len(text) < n:
        raise UserError(f"routing trace {str(path)!r} ends inside a record")
    return json.loads(text), n


def read_trace(path: str | Path) -> tuple[TraceHeader, list[TraceStep]]:
    """Every record of a trace file (a trace cut short mid-record is refused)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"routing trace {str(path)!r} does not exist")
    with path.open("rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise UserError(f"{str(path)!r} is not a routing trace (written by --record-routing)")
        meta, _ = _read_chunk(f, path)
        if meta.get("version") != VERSION:
            raise UserError(f"routing trace {str(path)!r} has version {meta.get('version')}")
        header = TraceHeader(meta["num_layers"], meta["top_k"], meta["num_experts"],
                             meta.get("model", ""))  # fmt: skip
        steps = []
        while (chunk := _read_chunk(f, path)) is not None:
            rec, _ = chunk
            requests = [(str(r[0]), int(r[1]), int(r[2])) for r in rec["requests"]]
            num_tokens = sum(n for _, _, n in requests)
            shape = (header.num_layers, num_tokens, header.top_k)
            nbytes = 2 * shape[0] * shape[1] * shape[2]
            data = f.read(nbytes)
            if len(data) < nbytes:
                raise UserError(f"routing trace {str(path)!r} ends inside a record")
            ids = np.frombuffer(data, dtype="<i2").reshape(shape).astype(np.int16)
            steps.append(TraceStep(rec["step"], requests, ids))
    return header, steps


def request_streams(steps: list[TraceStep]) -> list[tuple[str, int, np.ndarray]]:
    """Per request, in order of first appearance: (id, first position, ids (L, P, k)) for
    the longest run of consecutive positions from the first one the trace holds (0, unless
    a cached prompt prefix was not computed)."""
    seen: dict[str, dict[int, np.ndarray]] = {}
    for st in steps:
        offset = 0
        for rid, first, count in st.requests:
            rows = seen.setdefault(rid, {})
            for j in range(count):
                rows[first + j] = st.ids[:, offset + j]  # (L, k)
            offset += count
    streams = []
    for rid, rows in seen.items():
        start = end = min(rows)
        while end in rows:
            end += 1
        streams.append((rid, start, np.stack([rows[p] for p in range(start, end)], axis=1)))
    return streams
