"""The align of the grouped MoE GEMMs: `align_pairs` sorts a call's (token, k) pairs by
expert id (stable) and pads each id's run to a multiple of the GEMM's BLOCK_M, so that every
tile of rows shares one expert (`triton/moe_blocks.py` reads the result). Three methods with
the same outputs bit for bit — one Triton program (`moe_align_kernel`), a counting sort over
many programs (`triton/moe_sort.py`), torch ops — chosen from host-known sizes only. No host
sync: safe in CUDA graphs. Used by the bf16 (`moe_launch`), quantized (`quant_launch`) and
GGUF (`gguf_launch`) grouped paths."""

from __future__ import annotations

import torch
import triton

from xinfer.kernels.triton import fused_moe as moe_jit
from xinfer.kernels.triton import moe_sort

# element work of `align_pairs`' one-program kernel (`_kernel_work`) from which the default
# method is "count" (3-4 launches over many programs) instead: ~26 µs on one SM at the ~20
# elements/ns of the fourth session's sm_90 issue estimate — an estimate, not timed
COUNT_ALIGN_WORK = 1 << 19
# pairs a program of the "count" kernels ranks (BLOCK x BLOCK compares, COUNT_SUB columns at
# a time), and the most counts (blocks x ids) the one-program starts kernel also scans
COUNT_BLOCK, COUNT_SUB = 128, 32
ONE_PROGRAM_SCAN = 1 << 14


def align_pairs(
    topk_ids: torch.Tensor,
    num_ids: int,
    block_m: int,
    method: str | None = None,
    max_ids: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the (token, k) pairs by id (stable) and pad each id's run to a multiple of
    block_m. Ids must lie in [0, num_ids) (not checked: no host sync) or be negative: such
    pairs are left out (a chunk of the ids at a time, `quant_prefill`).

    `method`, all three with the same outputs bit for bit (interpreter tests; H200 tests):
    - "kernel": one Triton program, one launch, but its work grows with pairs × ids
      (`_kernel_work`; a 2048-token chunk is ≥ 0.26 ms of sm_90 issue over 128 experts,
      ≥ 1.3 ms over an offload view of ~1,000 rows: bench/NOTES.md, fourth session).
    - "count": a counting sort over blocks of COUNT_BLOCK pairs, 3 Triton launches (4 where
      blocks × ids > ONE_PROGRAM_SCAN) of many programs, work ~ pairs × COUNT_BLOCK
      compares + blocks × ids (`_align_by_count`).
    - "sort": a stable torch.sort and 34 more small torch ops, each a launch plus host time
      (`_align_by_sort`); no longer a default (tests, benchmarks).

    Default (`default_align_method`, host-known sizes only): "count" where the kernel's
    element work reaches COUNT_ALIGN_WORK (2^19, ~26 µs on its one SM), else "kernel". An
    estimate, neither timed on a GPU: below it the kernel's one launch should cost less than
    count's 2-3 more (each ~2-5 µs of GPU, plus host time in eager prefill), above it its
    one SM loses. "count" then takes every call of ≥ 4,096 pairs ("sort" before: 35 torch
    ops against 3-4 launches), calls over 128 ids (or a view numbered down to its layer's
    128 experts) from 1,639 pairs (205 tokens at top-8) and over an unnumbered 3,338-row
    view from 64; decode batches of up to 204 sequences at top-8 over 128 experts stay on
    "kernel".

    `max_ids`: the caller's promise that the call uses at most this many distinct ids (an
    offload slot view of ~850-3,300 rows whose layer has E experts: pass E). With it,
    max_rows (the outputs' length) is sized from the bound min(num_ids, pairs, max_ids), so
    the GEMMs' grids have fewer dead tiles: "kernel" where the bound has a smaller power of
    two than num_ids (it then numbers the used ids 0, 1, ... in id order in the same launch,
    `_number_ids`, O(pairs + num_ids), sorts by the numbers — one-hot work pairs ×
    next_pow2(bound) — and maps each tile's number back to its id), "count" always (its
    starts kernel numbers the used ids as it sums their rows). The outputs are those
    without, bit for bit, as far as the shorter outputs reach. A call using more ids than
    `max_ids` breaks the promise: the pairs of the ids numbered from the bound on (the
    largest ids) are left out, their outputs undefined, and nothing is written outside the
    buffers. "sort" ignores `max_ids`.

    Returns sorted_pairs int32 (max_rows,) (pair index, or num_pairs for padding),
    block_ids int32 (max_rows / block_m,) (the id of each tile; num_ids - 1 past num_rows),
    num_rows int32 (1,)."""
    topk_ids = topk_ids.to(torch.int32).contiguous()
    num_pairs, dev = topk_ids.numel(), topk_ids.device
    method = method or default_align_method(num_pairs, num_ids, max_ids)
    bound = min(num_ids, num_pairs)  # the most distinct ids the call can use
    if method == "sort":
        return _align_by_sort(
            topk_ids.view(-1), num_ids, block_m, _max_rows(num_pairs, bound, block_m)
        )
    if method == "count":
        if max_ids is not None:
            bound = min(bound, max(1, max_ids))  # as `_numbered_bound`
        return _align_by_count(topk_ids.view(-1), num_ids, block_m, bound)
    if method != "kernel":
        raise ValueError(f"align_pairs: method must be 'kernel', 'count' or 'sort', got {method!r}")
    numbered = _numbered_bound(num_ids, num_pairs, max_ids)
    bound = numbered or bound
    max_rows = _max_rows(num_pairs, bound, block_m)
    sorted_pairs = torch.empty(max_rows, dtype=torch.int32, device=dev)
    block_ids = torch.empty(max_rows // block_m, dtype=torch.int32, device=dev)
    num_rows = torch.empty(1, dtype=torch.int32, device=dev)
    if numbered:  # scratch of `_number_ids`: flags (num_ids,), experts (bound,), numbers (P,)
        scratch = torch.empty(num_ids + bound + num_pairs, dtype=torch.int32, device=dev)
        flags, experts, numbers = scratch.split([num_ids, bound, num_pairs])
    else:
        flags = experts = numbers = topk_ids  # unused
    block_ids_pow2 = triton.next_power_of_2(bound if numbered else num_ids)
    moe_jit.moe_align_kernel[(1,)](
        topk_ids, sorted_pairs, block_ids, num_rows, flags, experts, numbers,
        num_pairs, bound if numbered else num_ids, max_rows, num_ids,
        BLOCK_M=block_m, BLOCK_IDS=block_ids_pow2, CHUNK=_kernel_chunk(block_ids_pow2),
        NUMBERED=bool(numbered), NUMBER_BLOCK=1024, num_warps=8,
    )  # fmt: skip
    return sorted_pairs, block_ids, num_rows


def default_align_method(num_pairs: int, num_ids: int, max_ids: int | None = None) -> str:
    """`align_pairs`' method from host-known sizes: "count" where the one-program kernel's
    element work (over the ids it would sort by: numbered to `max_ids` or all) reaches
    COUNT_ALIGN_WORK, else "kernel"."""
    width = triton.next_power_of_2(_numbered_bound(num_ids, num_pairs, max_ids) or num_ids)
    return "count" if _kernel_work(num_pairs, width) >= COUNT_ALIGN_WORK else "kernel"


def _kernel_chunk(width: int) -> int:
    """Pairs an iteration of the align kernel takes: keeps its (chunk, ids) masks in registers."""
    return max(8, min(128, 8192 // width))


def _kernel_work(num_pairs: int, width: int) -> int:
    """Element work of the align kernel over `width` (a power of two) ids: a one-hot compare
    in its count and placement loops and a chunk × chunk rank compare, per pair."""
    return num_pairs * (2 * width + _kernel_chunk(width))


def _align_by_count(
    ids: torch.Tensor, num_ids: int, block_m: int, bound: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`align_pairs` as a counting sort over blocks of COUNT_BLOCK pairs (no host sync, fixed
    shapes: capturable; `triton/moe_sort.py`). count: per block, each id's count and each
    pair's rank among the block's earlier pairs of its id, and the padding fill; [prefix:
    per id, the exclusive prefix of its counts over the blocks and its total]; starts: the
    ids' padded rows, a cumsum over the ids (the used ids past `bound` get none), num_rows;
    place: each pair to its start + prefix + rank, and the tiles' ids by a binary search of
    the ends. The prefix runs inside the one-program starts kernel while blocks × ids <=
    ONE_PROGRAM_SCAN (calls over 128 ids up to 16,384 pairs: 2,048 tokens at top-8)."""
    num_pairs, dev = ids.numel(), ids.device
    max_rows = _max_rows(num_pairs, bound, block_m)
    num_blocks = max(1, triton.cdiv(num_pairs, COUNT_BLOCK))
    sorted_pairs = torch.empty(max_rows, dtype=torch.int32, device=dev)
    block_ids = torch.empty(max_rows // block_m, dtype=torch.int32, device=dev)
    num_rows = torch.empty(1, dtype=torch.int32, device=dev)
    # counts (num_blocks, num_ids), ranks (P,), totals / starts / ends (num_ids,)
    sizes = [num_blocks * num_ids, num_pairs, num_ids, num_ids, num_ids]
    scratch = torch.empty(sum(sizes), dtype=torch.int32, device=dev)
    counts, ranks, totals, starts, ends = scratch.split(sizes)
    fill_rows = 4096  # padding rows a program of the count launch fills
    grid = (max(num_blocks, triton.cdiv(max_rows, fill_rows)),)
    moe_sort.moe_count_kernel[grid](
        ids, counts, ranks, sorted_pairs, num_pairs, num_ids, max_rows, num_blocks,
        BLOCK=COUNT_BLOCK, SUB=COUNT_SUB, FILL_ROWS=fill_rows, FILL=1024, num_warps=4,
    )  # fmt: skip
    one_program = num_blocks * num_ids <= ONE_PROGRAM_SCAN
    scan = dict(BLOCKS=128, IDS=32, num_warps=4)  # (blocks, ids) tiles of the prefix
    if not one_program:
        moe_sort.moe_count_prefix_kernel[(triton.cdiv(num_ids, scan["IDS"]),)](
            counts, totals, num_blocks, num_ids, **scan
        )
    moe_sort.moe_count_starts_kernel[(1,)](
        counts, totals, starts, ends, num_rows, num_blocks, num_ids, bound,
        BLOCK_M=block_m, SCAN=one_program, CHUNK=1024, **scan,
    )  # fmt: skip
    tiles = 128  # block_ids a program of the place launch searches
    grid = (max(num_blocks, triton.cdiv(block_ids.numel(), tiles)),)
    moe_sort.moe_count_place_kernel[grid](
        ids, counts, ranks, starts, ends, sorted_pairs, block_ids,
        num_pairs, num_ids, block_ids.numel(), num_ids.bit_length(),
        BLOCK=COUNT_BLOCK, BLOCK_M=block_m, TILES=tiles, num_warps=4,
    )  # fmt: skip
    return sorted_pairs, block_ids, num_rows


def _max_rows(num_pairs: int, bound: int, block_m: int) -> int:
    """Rows the aligned pairs can take, from host-known sizes only: each of at most `bound`
    used ids adds < block_m padding rows."""
    return triton.cdiv(num_pairs + bound * (block_m - 1), block_m) * block_m


def _numbered_bound(num_ids: int, num_pairs: int, max_ids: int | None) -> int:
    """The id bound `align_pairs`' kernel numbers the used ids under, or 0 where it does not:
    without `max_ids`, or where the bound's power of two is num_ids' (nothing to gain)."""
    if max_ids is None or num_pairs == 0:
        return 0
    bound = max(1, min(num_ids, num_pairs, max_ids))
    return bound if triton.next_power_of_2(bound) < triton.next_power_of_2(num_ids) else 0


def _align_by_sort(
    ids: torch.Tensor, num_ids: int, block_m: int, max_rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`align_pairs` with torch ops (no host sync; capturable): a stable sort of the ids
    (left-out pairs as id num_ids, last), each pair's place = its id's padded start + its
    rank among the id's pairs, tiles' ids by a search of the padded ends."""
    num_pairs, dev = ids.numel(), ids.device
    key = torch.where(ids >= 0, ids.long(), num_ids)  # (P,) the left-out sort last
    order = torch.sort(key, stable=True).indices  # pair indices by id, ties by index
    counts = torch.zeros(num_ids + 1, dtype=torch.int64, device=dev)
    # integer sums, exact in any order; the left-out (key num_ids) add 0 and take no rows
    # (a weight, not an item assignment: a host scalar copy cannot be graph-captured)
    counts.index_add_(0, key, (key < num_ids).long())
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    start = torch.cumsum(counts, 0) - counts  # each id's first place in `order`
    sorted_key = key[order]
    rank = torch.arange(num_pairs, device=dev) - start[sorted_key]
    # the left-out go to a trash row past the end
    place = torch.where(sorted_key < num_ids, padded_start[sorted_key] + rank, max_rows)
    sorted_pairs = torch.full((max_rows + 1,), num_pairs, dtype=torch.int32, device=dev)
    sorted_pairs.scatter_(0, place, order.to(torch.int32))
    tile_starts = torch.arange(max_rows // block_m, device=dev) * block_m
    block_ids = torch.searchsorted(padded_end[:num_ids], tile_starts, right=True)
    block_ids = block_ids.clamp_(max=num_ids - 1).to(torch.int32)  # tiles past num_rows exit
    num_rows = padded_end[num_ids - 1 : num_ids].to(torch.int32)
    return sorted_pairs[:max_rows], block_ids, num_rows
