"""Launchers for the offload kernels: `lookup` and `fill` run the Triton kernels on CUDA
(graph-capturable: fixed grids, no host reads) and the reference twins elsewhere (CPU, or
`XINFER_DISABLE_TRITON=1`, where `fill` reads the miss count and is eager-only).

`fill` copies every expert tensor of a layer in one launch (up to eight tensors a launch, which
every format's set fits; more would take further launches) over a grid of
FILL_PROGRAMS_PER_SM programs per SM, whatever the number of misses: one missed expert gets
the whole grid's loads in flight. Packed tensors
(`--moe-offload-compress`, offload/packed.py) take a launch of the unpack kernel of their
own, on the same grid."""

from __future__ import annotations

import functools
from contextlib import nullcontext

import torch

from xinfer.kernels import use_triton
from xinfer.offload.lookup import check_call, check_id_range, fill_reference, lookup_reference
from xinfer.offload.packed import PackedExperts, unpack_fill
from xinfer.offload.slot_cache import LFU_SHIFT, LFU_STEP, SlotCache

FILL_BLOCK = 2048  # words per block of the fill's work list
FILL_NUM_WARPS = 4
FILL_PROGRAMS_PER_SM = 4
FILL_TENSORS_PER_LAUNCH = 8  # the fill kernel's tensor arguments: every format's set
LOOKUP_NUM_WARPS = 4
_WORDS = ((4, torch.int32), (2, torch.int16), (1, torch.uint8))


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def lookup(
    cache: SlotCache,
    topk_ids: torch.Tensor,
    *,
    force_triton: bool = False,
    num_warps: int = LOOKUP_NUM_WARPS,
    check_range: bool = True,
) -> torch.Tensor:
    """(T, k) expert ids → (T, k) int32 rows of `cache.slots`; writes the miss list for
    `fill`. Host-side ids are range-checked here (`check_range=False` lets a test hand bad
    ids to the kernel, which clamps them); device ids are not read (see offload/lookup.py)."""
    check_call(cache, topk_ids)
    if not (force_triton or use_triton(topk_ids)):
        return lookup_reference(cache, topk_ids)
    if check_range and not topk_ids.is_cuda:
        check_id_range(topk_ids, cache.num_experts)
    from xinfer.kernels.triton.offload import lookup_kernel

    ids = topk_ids.to(torch.int32).contiguous()
    slot_ids = torch.empty_like(ids)
    block_e = _next_pow2(cache.num_experts)
    # Ids a block: the whole call when it is small (decode), else what keeps the (E, N)
    # compare tiles near 2048 elements a warp.
    cap = max(8, min(1024, 2048 * num_warps // block_e))
    block_n = min(cap, max(8, _next_pow2(ids.numel())))
    with torch.cuda.device(ids.device) if ids.is_cuda else nullcontext():
        lookup_kernel[(1,)](
            ids,
            slot_ids,
            ids.numel(),
            cache.slot_of_expert,
            cache.expert_of_slot,
            cache.last_use,
            cache.clock,
            cache.miss_ids,
            cache.miss_slots,
            cache.miss_count,
            cache.counters,
            cache.num_experts,
            cache.num_slots,
            cache.overflow_base,
            cache.score,
            cache.slot_score,
            cache.num_overflow,
            BLOCK_E=block_e,
            BLOCK_S=_next_pow2(cache.num_slots),
            BLOCK_N=block_n,
            LFU=cache.policy == "lfu",
            LFU_SHIFT=LFU_SHIFT,
            LFU_STEP=LFU_STEP,
            num_warps=num_warps,
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


def fill_grid(device: torch.device, programs_per_sm: int = FILL_PROGRAMS_PER_SM) -> int:
    """The fill kernel's fixed number of programs on `device` (a few for the interpreter)."""
    return programs_per_sm * _num_sms(device) if device.type == "cuda" else 3


def fill(
    cache: SlotCache,
    host_tensors: dict[str, torch.Tensor | PackedExperts],
    *,
    force_triton: bool = False,
    num_programs: int | None = None,
    block: int = FILL_BLOCK,
    num_warps: int = FILL_NUM_WARPS,
) -> None:
    """Copy the experts of the last lookup's miss list into their slots (packed tensors:
    unpack them there, two a launch, offload/packed.py).

    The grid is fixed (`num_programs`, default `fill_grid`) and the miss count is read on
    the device, so the launch is graph-safe."""
    device_is_cuda = cache.device.type == "cuda"
    if not (force_triton or (device_is_cuda and use_triton(cache.miss_count))):
        fill_reference(cache, host_tensors)
        return
    from xinfer.kernels.triton.offload import fill_kernel

    grid = (num_programs or fill_grid(cache.device),)
    packed = [n for n, t in host_tensors.items() if isinstance(t, PackedExperts)]
    for i in range(0, len(packed), 2):
        group = packed[i : i + 2]
        unpack_fill(
            [host_tensors[n] for n in group],
            [cache.slots[n] for n in group],
            cache.miss_ids,
            cache.miss_slots,
            cache.miss_count,
            grid[0],
            mapped=device_is_cuda,
        )
    names = [n for n in host_tensors if n not in packed]
    for i in range(0, len(names), FILL_TENSORS_PER_LAUNCH):
        args = []
        group = names[i : i + FILL_TENSORS_PER_LAUNCH]
        for name in group:
            host, dst = host_tensors[name], cache.slots[name]
            row_bytes = host[0].numel() * host.element_size()
            size, dtype = word_dtype(row_bytes, host.data_ptr(), dst.data_ptr())
            src = MappedWords(host, dtype) if device_is_cuda else as_words(host, dtype)
            args += [src, as_words(dst, dtype), row_bytes // size]
        args += args[:3] * (FILL_TENSORS_PER_LAUNCH - len(group))  # unused slots
        with torch.cuda.device(cache.device) if device_is_cuda else nullcontext():
            fill_kernel[grid](
                *args,
                cache.miss_ids,
                cache.miss_slots,
                cache.miss_count,
                NUM_TENSORS=len(group),
                BLOCK=block,
                num_warps=num_warps,
            )
