"""Lossless packing of bf16 expert tensors in the host store (`--moe-offload-compress`): what
crosses the host→GPU link on a miss is 12 bits an element instead of 16, and the fill kernel
unpacks it into the slot, bit for bit, so output does not change.

Why it works: a trained (or N(0, σ)) weight's bf16 exponent takes few values — a layer's
elements lie within 15 octaves of each other but for rare tiny ones — while sign and
mantissa are near-uniform. So each element keeps its sign and 7 mantissa bits as one byte
(`low`) and its 8-bit exponent as a 4-bit code: `exponent - base` for the 15 exponents
`[base, base + 14]` of the layer tensor's densest window, 15 ("escape") otherwise; escaped
exponents are stored apart, in element order (`escapes`), with per-block offsets (`starts`)
so that any block decodes on its own.

Layout of one `[E, *row]` bf16 tensor of n = prod(row) elements an expert (n % 8 == 0):
  low      (E, n) uint8       element i's sign << 7 | mantissa
  codes    (E, n / 8) int32   nibble i of word w: element 8w + i's exponent code
  escapes  (E, C) uint8       the escaped exponents of each expert, in element order
                              (C: the layer tensor's most escapes of one expert, >= 1)
  starts   (E, B) int32       escapes before each PACK_BLOCK-element block (B blocks)
so an expert crosses the link as 1.5 bytes an element plus 4 bytes a block and its escapes.

`pack_experts` packs (or returns None where it would not save: not bf16, n % 8 != 0, or more
than MAX_PACKED_RATIO of the bytes); `PackedExperts.unpack_row` is the reference twin of the
Triton unpack (kernels/triton/offload_packed.py), `unpack_fill` its launcher. Helpers that
take a store entry (a tensor or PackedExperts): `unpacked_row_bytes`, `stored_row_bytes`.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from xinfer.host_memory import host_empty

PACK_BLOCK = 4096  # elements a block: `starts` granularity, and the unpack kernel's tile
ESCAPE = 15  # the code of an exponent outside [base, base + 14]
WINDOW = 15  # exponents a code can name
MAX_PACKED_RATIO = 0.8  # pack a tensor only if it shrinks to at most this share of its bytes
PACK_CHUNK_ELEMENTS = 1 << 25  # elements packed at once (~0.7 GB of temporaries)
WINDOW_SAMPLE_STRIDE = 61  # the window's histogram counts every 61st element (prime: no
# alignment with rows)
UNPACK_NUM_WARPS = 4


class Pinner(Protocol):
    """What packing asks of the host store (offload/host_store.py) on CUDA."""

    def pin_after_fill(self, t: torch.Tensor) -> torch.Tensor: ...

    def unpin(self, t: torch.Tensor) -> None: ...


@dataclass(frozen=True)
class PackedExperts:
    """One layer's `[E, *row_shape]` bf16 expert tensor, packed (see the module docstring).
    `shape` and `dtype` are the unpacked tensor's, so code that sizes slots from a store
    entry takes either."""

    row_shape: tuple[int, ...]
    base: int
    low: torch.Tensor
    codes: torch.Tensor
    escapes: torch.Tensor
    starts: torch.Tensor

    dtype = torch.bfloat16  # the unpacked dtype

    @property
    def num_experts(self) -> int:
        return self.low.shape[0]

    @property
    def shape(self) -> tuple[int, ...]:
        """The unpacked tensor's shape."""
        return (self.num_experts, *self.row_shape)

    @property
    def row_numel(self) -> int:
        return self.low.shape[1]

    @property
    def planes(self) -> dict[str, torch.Tensor]:
        return {
            "low": self.low,
            "codes": self.codes,
            "escapes": self.escapes,
            "starts": self.starts,
        }

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.planes.values())

    def with_planes(self, planes: dict[str, torch.Tensor]) -> PackedExperts:
        """The same packing over other copies of the planes (pinned ones)."""
        return replace(self, **planes)

    def unpack_row(self, expert: int) -> torch.Tensor:
        """Expert `expert`'s bf16 row, unpacked on the host (the reference twin)."""
        n = self.row_numel
        low = self.low[expert].to(torch.int32)  # (n,)
        nibbles = self.codes[expert].view(torch.uint8).to(torch.int32)  # (n / 2,)
        code = torch.stack([nibbles & 15, nibbles >> 4], dim=1).reshape(n)
        exponent = code + self.base
        escaped = (code == ESCAPE).nonzero().reshape(-1)
        exponent[escaped] = self.escapes[expert, : escaped.numel()].to(torch.int32)
        bits = ((low & 0x80) << 8) | (exponent << 7) | (low & 0x7F)
        bits = bits - ((bits >> 15) << 16)  # into int16's range
        return bits.to(torch.int16).view(torch.bfloat16).view(self.row_shape)


def _exponents(t: torch.Tensor) -> torch.Tensor:
    return (t.reshape(-1).view(torch.int16).to(torch.int32) >> 7) & 0xFF


def _chunks(t: torch.Tensor):
    """(first expert, experts) slices of `t` of about PACK_CHUNK_ELEMENTS elements."""
    per = max(1, PACK_CHUNK_ELEMENTS // max(1, t[0].numel()))
    for first in range(0, t.shape[0], per):
        yield first, t[first : first + per]


def densest_window(t: torch.Tensor) -> int:
    """The `base` whose window [base, base + 14] holds the most of `t`'s exponents, counted
    on every WINDOW_SAMPLE_STRIDE-th element (the window follows the bulk of the values;
    any base is lossless, a worse one only escapes more)."""
    flat = t.reshape(-1)
    sample = flat[::WINDOW_SAMPLE_STRIDE] if flat.numel() > WINDOW_SAMPLE_STRIDE**2 else flat
    counts = torch.bincount(_exponents(sample.contiguous()), minlength=256)
    in_window = counts.unfold(0, WINDOW, 1).sum(dim=1)  # (256 - 14,): window at each base
    return int(in_window.argmax())


def _pack_rows(rows: torch.Tensor, base: int) -> tuple:
    """Experts' rows (c, ...) → (low bytes (c, n), code nibbles (c, n / 2), the escaped
    exponents of all c experts in order, escapes per expert (c,), block starts (c, B)), on
    the rows' device."""
    c = rows.shape[0]
    bits = rows.reshape(c, -1).view(torch.int16).to(torch.int32) & 0xFFFF
    n = bits.shape[1]
    exponent = (bits >> 7) & 0xFF
    low = (((bits >> 8) & 0x80) | (bits & 0x7F)).to(torch.uint8)
    code = exponent - base
    escaped = (code < 0) | (code >= ESCAPE)
    code = torch.where(escaped, ESCAPE, code)
    nibbles = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    flat = exponent[escaped].to(torch.uint8)  # row-major: expert by expert, in element order
    blocks = -(-n // PACK_BLOCK)
    padded = torch.nn.functional.pad(escaped.to(torch.int32), (0, blocks * PACK_BLOCK - n))
    per_block = padded.view(c, blocks, PACK_BLOCK).sum(dim=2, dtype=torch.int32)
    starts = torch.cumsum(per_block, dim=1, dtype=torch.int32) - per_block
    return low, nibbles, flat, escaped.sum(dim=1), starts


def packable(t: torch.Tensor) -> bool:
    """Whether an `[E, ...]` tensor has the layout packing takes: bf16 rows of a nonzero
    multiple of 8 elements (whether it saves bytes is known only once packed)."""
    if t.dtype != torch.bfloat16 or t.dim() < 2:
        return False
    n = math.prod(t.shape[1:])
    return n > 0 and n % 8 == 0


def plane_buffers(t: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """The host buffers `pack_experts` fills for `t` (`low`, `codes` as bytes, `starts`;
    their pages faulted in by `host_empty`), or None where `t` does not pack. Made apart from
    the packing so that a layer's can be made while the one before it packs
    (offload/setup.py)."""
    if not packable(t) or t.device.type != "cpu":
        return None
    num_experts, n = t.shape[0], math.prod(t.shape[1:])
    return {
        "low": host_empty((num_experts, n), torch.uint8),  # huge pages: the fill reads these
        "codes": host_empty((num_experts, n // 2), torch.uint8),
        "starts": host_empty((num_experts, -(-n // PACK_BLOCK)), torch.int32),
    }


def pack_experts(
    t: torch.Tensor,
    device: torch.device | None = None,
    pinner: Pinner | None = None,
    buffers: dict[str, torch.Tensor] | None = None,
) -> PackedExperts | None:
    """Pack a host `[E, ...]` bf16 tensor, or None where packing does not apply or save.
    The arithmetic runs on `device` (default the host) a chunk of experts at a time, each
    chunk crossing to it once: beyond the result, the host holds one chunk's planes.
    `pinner` (the host store, on CUDA) pins the big planes before they are filled, so that
    the chunks' results come back as asynchronous DMA (and unpins them on a decline).
    `buffers`: `plane_buffers(t)`, made beforehand (else made here)."""
    if not packable(t) or t.device.type != "cpu":
        return None
    buffers = buffers or plane_buffers(t)
    num_experts = t.shape[0]
    device = torch.device(device or "cpu")
    base = densest_window(t)
    low, codes, starts = buffers["low"], buffers["codes"], buffers["starts"]
    assert low.shape == (num_experts, math.prod(t.shape[1:])), "plane buffers of another tensor"
    on_device = device.type == "cuda"
    pinned = pinner is not None
    if pinned:
        low, codes, starts = (pinner.pin_after_fill(x) for x in (low, codes, starts))
    escaped: list[torch.Tensor] = []
    for first, chunk in _chunks(t):
        low_c, codes_c, flat_c, counts_c, starts_c = _pack_rows(
            chunk.to(device, non_blocking=on_device), base
        )
        stop = first + chunk.shape[0]
        for plane, part in ((low, low_c), (codes, codes_c), (starts, starts_c)):
            plane[first:stop].copy_(part, non_blocking=on_device)
        escaped += flat_c.cpu().split(counts_c.cpu().tolist())  # (waits for the chunk)
    if on_device:
        torch.cuda.synchronize(device)  # the last planes' copies have landed
    width = max(1, max(x.numel() for x in escaped))
    escapes = torch.zeros((num_experts, width), dtype=torch.uint8, device="cpu")
    for e, x in enumerate(escaped):
        escapes[e, : x.numel()] = x
    packed = PackedExperts(
        row_shape=tuple(t.shape[1:]),
        base=base,
        low=low,
        codes=codes.view(torch.int32),
        escapes=escapes,
        starts=starts,
    )
    if packed.nbytes > MAX_PACKED_RATIO * t.numel() * t.element_size():
        if pinned:
            for x in (low, codes, starts):
                pinner.unpin(x)
        return None
    return packed


def layer_plane_buffers(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """`plane_buffers` of each of a layer's tensors that packs."""
    out = {}
    for name, t in tensors.items():
        buffers = plane_buffers(t)
        if buffers is not None:
            out[name] = buffers
    return out


def pack_layer(
    tensors: dict[str, torch.Tensor],
    device: torch.device | None = None,
    pinner: Pinner | None = None,
    buffers: dict[str, dict[str, torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor | PackedExperts]:
    """A layer's expert set with every tensor that packs replaced by its packing (computed
    on `device`: the GPU, when there is one, packs a layer in a fraction of a second;
    `pinner`: see pack_experts; `buffers`: `layer_plane_buffers(tensors)`, made
    beforehand)."""
    out: dict[str, torch.Tensor | PackedExperts] = {}
    for name, t in tensors.items():
        packed = pack_experts(t, device, pinner, (buffers or {}).get(name))
        out[name] = t if packed is None else packed
    return out


# --- what shared code asks of a store entry (a tensor or a PackedExperts) ------------------


def unpacked_row_bytes(entry: torch.Tensor | PackedExperts) -> int:
    """Bytes of one expert as the slots hold it."""
    return math.prod(entry.shape[1:]) * entry.dtype.itemsize


def stored_row_bytes(entry: torch.Tensor | PackedExperts) -> int:
    """Bytes one expert takes in the host store: what a miss moves over the link (for a
    packing, at most: only the escapes an expert has are read)."""
    return entry.nbytes // entry.shape[0]


def unpack_rows_reference(
    packed: PackedExperts, dst: torch.Tensor, pairs: list[tuple[int, int]]
) -> None:
    """Unpack experts into rows of `dst`: (expert, row) pairs."""
    for e, r in pairs:
        dst[r].copy_(packed.unpack_row(e), non_blocking=True)


def unpack_fill(
    packed: list[PackedExperts],
    dst: list[torch.Tensor],
    miss_ids: torch.Tensor,
    miss_slots: torch.Tensor,
    miss_count: torch.Tensor,
    num_programs: int,
    *,
    mapped: bool,
) -> None:
    """The Triton unpack of up to two packed tensors of a layer (one launch): the first
    `miss_count` (device) experts of `miss_ids` into rows `miss_slots` of their `dst`
    tensors. A fixed grid and no host read: graph-safe. `mapped`: the planes are pinned,
    device-mapped host memory (CUDA) rather than tensors the kernel can take as they are."""
    from xinfer.kernels.triton.offload_packed import unpack_fill_kernel
    from xinfer.offload.kernels import MappedWords

    if not 1 <= len(packed) <= 2 or len(packed) != len(dst):
        raise ValueError("unpack_fill takes one or two packed tensors with their slot tensors")
    args = []
    for p, d in zip(packed, dst):
        if tuple(d.shape[1:]) != p.row_shape or d.dtype != torch.bfloat16:
            raise ValueError(f"slot tensor {tuple(d.shape)} {d.dtype} is not {p.row_shape} bf16")
        planes = [MappedWords(t, t.dtype) if mapped else t for t in p.planes.values()]
        words, capacity, blocks = p.codes.shape[1], p.escapes.shape[1], p.starts.shape[1]
        args += [*planes, d.view(torch.int16), words, capacity, blocks, p.base]
    args += args[:9] * (2 - len(packed))  # the unused second tensor
    on_cuda = dst[0].is_cuda
    with torch.cuda.device(dst[0].device) if on_cuda else nullcontext():
        unpack_fill_kernel[(num_programs,)](
            *args,
            miss_ids,
            miss_slots,
            miss_count,
            NUM_TENSORS=len(packed),
            BLOCK=PACK_BLOCK,
            num_warps=UNPACK_NUM_WARPS,
        )
