"""Opens a GGUF checkpoint (one file, or the `-00001-of-0000N.gguf` parts of a split one)
and exposes its metadata and its tensors as uint8 byte rows memory-mapped from the file
(nothing is copied through Python). Damaged files and block types we cannot run are refused
with one sentence. The header is parsed here rather than with the `gguf` package's reader,
which builds a numpy array per string and takes ~20 s on a 262k-token vocabulary."""

from __future__ import annotations

import re
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xinfer.errors import UserError
from xinfer.quant.gguf_blocks import BY_ID, BlockType

_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_MAGIC = b"GGUF"
_ALIGNMENT = 32
# GGUF value type → numpy dtype of its scalars (8 = string, 9 = array)
_SCALARS = {
    0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
    6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64,
}  # fmt: skip


def is_gguf_path(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf")


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: `shape` is the logical torch-order shape (rows..., row_len); `raw` holds
    its blocks as (rows..., row_bytes) uint8, a view of the memory-mapped file."""

    name: str
    btype: BlockType
    shape: tuple[int, ...]
    raw: torch.Tensor

    @property
    def row_len(self) -> int:
        return self.shape[-1]


@dataclass
class GGUFCheckpoint:
    paths: list[Path]
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        """`key` under the architecture's prefix: get("block_count") → "<arch>.block_count"."""
        return self.metadata.get(f"{self.arch}.{key}", default)


class _Truncated(Exception):
    pass


class _Header:
    """Sequential reader over the file's bytes (a read-only memory map)."""

    def __init__(self, data: np.ndarray) -> None:
        self.buf, self.pos = memoryview(data), 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise _Truncated
        value = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise _Truncated
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int) -> Any:
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.take("<I"), self.take("<Q")
            if etype == 8:
                return [self.string() for _ in range(count)]
            if etype not in _SCALARS:
                raise ValueError(f"array of value type {etype}")
            dtype = np.dtype(_SCALARS[etype]).newbyteorder("<")
            end = self.pos + count * dtype.itemsize
            if end > len(self.buf):
                raise _Truncated
            arr = np.frombuffer(self.buf[self.pos : end], dtype=dtype)
            self.pos = end
            return arr.tolist()
        if vtype not in _SCALARS:
            raise ValueError(f"value type {vtype}")
        dtype = np.dtype(_SCALARS[vtype])
        return np.frombuffer(self.take(f"<{dtype.itemsize}s"), dtype=dtype.newbyteorder("<"))[
            0
        ].item()


def split_parts(path: Path) -> list[Path]:
    """All parts of a split GGUF given any one of them (or [path] for a single file)."""
    m = _SPLIT.match(path.name)
    if not m:
        return [path]
    count = int(m["count"])
    parts = [
        path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)
    ]
    absent = [p.name for p in parts if not p.is_file()]
    if absent:
        raise UserError(f"split GGUF {path.name!r} is missing its parts {', '.join(absent)}")
    return parts


def _parse(
    path: Path,
) -> tuple[dict[str, Any], list[tuple[str, int, tuple[int, ...], int]], np.ndarray, int]:
    data = (
        np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)
    )
    h = _Header(data)
    if len(data) < 4 or bytes(data[:4]) != _MAGIC:
        raise UserError(f"{str(path)!r} is not a GGUF file (its first bytes are not 'GGUF')")
    h.pos = 4
    version = h.take("<I")
    if version not in (2, 3):
        raise UserError(f"{str(path)!r} is GGUF version {version}; xinfer reads versions 2 and 3")
    num_tensors, num_kv = h.take("<Q"), h.take("<Q")
    metadata = {}
    for _ in range(num_kv):
        key = h.string()
        metadata[key] = h.value(h.take("<I"))
    infos = []
    for _ in range(num_tensors):
        name = h.string()
        dims = [h.take("<Q") for _ in range(h.take("<I"))]
        infos.append((name, h.take("<I"), tuple(reversed(dims)), h.take("<Q")))
    align = int(metadata.get("general.alignment", _ALIGNMENT))
    return metadata, infos, data, -(-h.pos // align) * align


def _tensor(path: Path, info: tuple, data: np.ndarray, data_start: int) -> GGUFTensor:
    name, type_id, shape, offset = info
    btype = BY_ID.get(type_id)
    if btype is None:
        raise UserError(
            f"GGUF tensor {name!r} in {path.name} has block type {type_id}, which xinfer cannot "
            f"run; use a file with {', '.join(b.name for b in BY_ID.values())}"
        )
    shape = shape or (1,)
    row_bytes = btype.row_bytes(shape[-1])
    num_bytes = int(np.prod(shape[:-1], dtype=np.int64)) * row_bytes
    start = data_start + offset
    if start + num_bytes > len(data):
        raise UserError(
            f"{str(path)!r} is cut short (tensor {name!r} ends past the end of the file); "
            "download it again"
        )
    rows = data[start : start + num_bytes].reshape(*shape[:-1], row_bytes)
    with warnings.catch_warnings():  # a read-only map: the engine never writes into it
        warnings.simplefilter("ignore", UserWarning)
        return GGUFTensor(name, btype, tuple(shape), torch.from_numpy(rows))


def open_gguf(path: str | Path) -> GGUFCheckpoint:
    """Parse the header(s); tensors stay memory-mapped."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"model path {str(p)!r} does not exist")
    metadata: dict[str, Any] = {}
    tensors: dict[str, GGUFTensor] = {}
    parts = split_parts(p)
    for part in parts:
        try:
            meta, infos, data, data_start = _parse(part)
        except (_Truncated, ValueError, OverflowError, MemoryError) as e:
            why = "it is cut short" if isinstance(e, _Truncated) else f"bad header: {e}"
            raise UserError(
                f"{str(part)!r} is not a complete GGUF file ({why}); download it again"
            ) from None
        if part == parts[0]:
            metadata = meta
        for info in infos:
            tensors[info[0]] = _tensor(part, info, data, data_start)
    if "general.architecture" not in metadata:
        raise UserError(f"{str(p)!r} has no general.architecture; it is not a model GGUF")
    return GGUFCheckpoint(parts, metadata, tensors)
