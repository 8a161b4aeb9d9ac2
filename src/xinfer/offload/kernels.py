"""Launchers for the offload kernels: `lookup` and `fill` run the Triton kernels on CUDA
(graph-capturable: fixed grids, no host reads) and the reference twins elsewhere (CPU, or
`XINFER_DISABLE_TRITON=1`, where `fill` reads the miss count and is eager-only)."""

from __future__ import annotations

import functools
from contextlib import nullcontext

import torch

from xinfer.kernels import use_triton
from xinfer.offload.lookup import fill_reference, lookup_reference
from xinfer.offload.slot_cache import SlotCache

FILL_BLOCK = 2048  # words per inner step of a fill program
FILL_NUM_WARPS = 4
FILL_PROGRAMS_PER_SM = 4
_WORDS = ((4, torch.int32), (2, torch.int16), (1, torch.uint8))


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def lookup(cache: SlotCache, topk_ids: torch.Tensor, *, force_triton: bool = False) -> torch.Tensor:
    """(T, k) expert ids → (T, k) int32 slot ids; writes the miss list for `fill`."""
    if topk_ids.dim() != 2:
        raise ValueError(f"lookup: topk_ids must be (T, k), got {tuple(topk_ids.shape)}")
    if not (force_triton or use_triton(topk_ids)):
        return lookup_reference(cache, topk_ids)
    from xinfer.kernels.triton.offload import lookup_kernel

    ids = topk_ids.to(torch.int32).contiguous()
    slot_ids = torch.empty_like(ids)
    block_e = _next_pow2(cache.num_experts)
    block_n = max(16, min(1024, 8192 // block_e))
    with torch.cuda.device(ids.device) if ids.is_cuda else nullcontext():
        lookup_kernel[(1,)](
            ids,
            slot_ids,
            ids.numel(),
            cache.slot_of_expert,
            cache.expert_of_slot,
            cache.last_use,
            cache.clock,
            cache.scratch,
            cache.miss_ids,
            cache.miss_slots,
            cache.miss_count,
            cache.counters,
            cache.num_experts,
            cache.num_slots,
            BLOCK_E=block_e,
            BLOCK_S=_next_pow2(cache.num_slots),
            BLOCK_N=block_n,
            num_warps=4,
        )
    return slot_ids


def word_dtype(row_bytes: int, *ptrs: int) -> tuple[int, torch.dtype]:
    """The widest word that divides a row and every base pointer: any dtype copies as words."""
    for size, dtype in _WORDS:
        if row_bytes % size == 0 and all(p % size == 0 for p in ptrs):
            return size, dtype
    raise AssertionError("unreachable: bytes always divide")


def as_words(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor's bytes viewed as a flat tensor of `dtype` words."""
    return t.reshape(-1).view(torch.uint8).view(dtype)


class MappedWords:
    """What Triton needs of a pointer argument: host memory registered as mapped (UVA), which
    the Triton launcher translates to its device address with cuPointerGetAttribute."""

    def __init__(self, host: torch.Tensor, dtype: torch.dtype) -> None:
        self.host, self.dtype = host, dtype  # keep the host tensor alive

    def data_ptr(self) -> int:
        return self.host.data_ptr()


def fill(
    cache: SlotCache,
    host_tensors: dict[str, torch.Tensor],
    max_misses: int,
    *,
    force_triton: bool = False,
    num_chunks: int | None = None,
    block: int = FILL_BLOCK,
) -> None:
    """Copy the experts of the last lookup's miss list into their slots.

    `max_misses` (host-side bound, e.g. min(T*k, S)) fixes the grid; programs beyond the
    device-side miss count return at once, so the launch is graph-safe."""
    device_is_cuda = cache.device.type == "cuda"
    if not (force_triton or (device_is_cuda and use_triton(cache.miss_count))):
        fill_reference(cache, host_tensors)
        return
    from xinfer.kernels.triton.offload import fill_kernel

    max_misses = max(1, min(max_misses, cache.num_slots))
    for name, host in host_tensors.items():
        dst = cache.slots[name]
        row_bytes = host[0].numel() * host.element_size()
        size, dtype = word_dtype(row_bytes, host.data_ptr(), dst.data_ptr())
        row_words = row_bytes // size
        if num_chunks is not None:
            chunks = num_chunks
        elif device_is_cuda:
            chunks = -(-FILL_PROGRAMS_PER_SM * _num_sms(cache.device) // max_misses)
        else:
            chunks = 2
        chunks = max(1, min(chunks, -(-row_words // block)))
        src = MappedWords(host, dtype) if device_is_cuda else as_words(host, dtype)
        with torch.cuda.device(cache.device) if device_is_cuda else nullcontext():
            fill_kernel[(max_misses, chunks)](
                src,
                as_words(dst, dtype),
                cache.miss_ids,
                cache.miss_slots,
                cache.miss_count,
                row_words,
                BLOCK=block,
                num_warps=FILL_NUM_WARPS,
            )
