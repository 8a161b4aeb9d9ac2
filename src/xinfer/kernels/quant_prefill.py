"""The prefill path of the quantized formats: dequantize the weight to the activation dtype
(`triton/quant_dequant_kernel.py`; GGUF block types: `triton/gguf_dequant_kernel.py`, through
`fused_moe_with` and `gguf_launch.dequantize`), then run the bf16 kernels the unquantized model runs
(`kernels.linear`: cuBLAS at these sizes; `moe_launch`'s grouped GEMMs). The twins
dequantize to the activation dtype and then multiply, so this is the twin's math exactly:
the dequantized weight has the twin's bits, and the bf16 kernels then give the bits that
they give an unquantized model holding those weights. Launched from `quant_launch` from
PREFILL_MIN_ROWS rows (linears) and PREFILL_MIN_PAIRS (token, k) pairs (routed experts, in
the formats whose `dequant_experts_in_prefill` asks for it: NVFP4; FP8 and INT4 run their
prefill-sized expert calls in registers, faster as measured), and by `gguf_launch`.

Cost: the dequantization moves the stored bytes once and writes the dense copy once, per
call. Linears dequantize the whole weight (a transient N x K copy; one F.linear keeps the
twin's bits). Experts: the ids the call uses are numbered 0, 1, ... in id order on the
device (`compact_ids`; ids keep their own where the set is no larger than the bound below),
and those numbers are dequantized in chunks of `chunk` (ids no pair uses skipped) into one
reused buffer of at most CHUNK_BYTES, each chunk's pairs running the grouped GEMMs (the other
pairs' ids set to -1, which `align_pairs` leaves out) into one (T*k, H) buffer of unweighted
outputs that is combined once at the end, in k order: bits do not depend on the chunking.
The chunks cover the numbers a call can need (`id_bound`: at most its pairs, and at most
`max_ids`, the layer's experts, however many rows the set has), not the rows of the set: an
offload slot view holds every later layer's slots and the shared regions (slot_pool.py:
3,338 rows for layer 0 of Qwen3-30B-A3B at 67 slots), and chunking its rows took 120
rounds of dequant + align + grouped GEMMs a call (~40 launches each, the sorted align's small
torch ops most of them) where 5 rounds hold every expert a call can use.

For Qwen3-30B-A3B (128 experts, H 2048, I 768) a 2048-token prefill touches all of them: per
layer 0.6 GB of FP8 read and 1.2 GB of bf16 written, ~0.4 ms at ~4.5 TB/s, beside ~0.15
TFLOP of grouped GEMM; acceptable for prefill, where the in-register GEMMs re-dequantize
every weight tile for each tile of rows. Each touched weight costs its stored bytes plus
2 + 2 bf16 bytes (written, read back): ~5x the bytes of an in-register pass for FP8, ~9x for
4-bit, which is what decode-sized calls would pay; hence `quant_launch`'s size bounds.

No host sync (fixed shapes, ids numbered on the device): safe in CUDA graphs."""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton

from xinfer import kernels
from xinfer.kernels import moe_launch, permute_launch
from xinfer.kernels.quant_groups import group_t
from xinfer.kernels.triton import quant_dequant_kernel as jit
from xinfer.quant.base import KernelWeights

CHUNK_BYTES = 256 << 20  # the dense copy of one chunk of experts (w13 and w2)
BLOCK_N, BLOCK_K = 32, 128  # dequant tiles: elementwise, so the bits do not depend on them


def dequantize(
    kw: KernelWeights,
    n: int,
    k: int,
    out: torch.Tensor,
    first: int = 0,
    ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Experts first .. first + len(out) of the `[E, ...]` set `kw` (N, K each) → `out`
    (count, N, K), contiguous rows, in its dtype; given `ids` (int32, contiguous), experts
    ids[first + j] → out[j] instead, a negative id skipped (its rows of `out` left as they
    are). An act-order set (`kw.perm` (E, K)) is written in input-channel order."""
    count = out.shape[0]
    if count == 0 or n == 0 or k == 0:
        return out
    z = kw.z if kw.z is not None else kw.s
    p = kw.perm if kw.perm is not None else kw.s  # (never read without a perm)
    perm = {"HAS_PERM": True} if kw.perm is not None else {}
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(k, BLOCK_K), count)
    jit.dequant_kernel[grid](
        kw.w, kw.s, z, p, ids if ids is not None else kw.s, out,
        first, n, k,
        kw.w.stride(0), kw.w.stride(1), kw.s.stride(0), kw.s.stride(1),
        z.stride(0), z.stride(1), p.stride(0), out.stride(0), out.stride(1), **perm,
        FMT=kw.fmt_code, SCALE_BN=kw.scale_bn, SCALE_BK=kw.scale_bk, HAS_ZERO=kw.has_zero,
        GATHER=ids is not None, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        GROUP_T=group_t(kw, BLOCK_K, k), num_warps=4,
    )  # fmt: skip
    return out


def dequantize_weight(kw: KernelWeights, n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """One (N, K) weight → its dense copy in `dtype` (an expert set of one), in its stored
    column order (an act-order weight's: sorted by group)."""
    one = KernelWeights(
        kw.fmt_code, kw.w.unsqueeze(0), kw.s.unsqueeze(0),
        None if kw.z is None else kw.z.unsqueeze(0), kw.scale_bn, kw.scale_bk, kw.has_zero,
    )  # fmt: skip
    out = torch.empty(1, n, k, dtype=dtype, device=kw.w.device)
    return dequantize(one, n, k, out)[0]


def linear(x2: torch.Tensor, kw: KernelWeights, bias: torch.Tensor | None, n: int, k: int):
    """x2 (M, K) @ W^T (+ bias) → (M, N): W dequantized to x2's dtype, then the linear of
    the unquantized model. An act-order weight stays in its sorted column order and x2's
    columns follow it (M x K gathered once, not N x K scattered): the twin's values, summed
    in another order over K."""
    if kw.perm is not None:
        x2 = permute_launch.columns(x2, kw.perm)
    return kernels.linear(x2, dequantize_weight(kw, n, k, x2.dtype), bias)


def chunk_size(num_ids: int, hidden_dim: int, inter: int, dtype: torch.dtype) -> int:
    """Experts per chunk: the most whose dense w13 and w2 fit CHUNK_BYTES, evened out over
    the chunks that `num_ids` needs (at least one)."""
    per_expert = 3 * inter * hidden_dim * torch.empty((), dtype=dtype).element_size()
    most = max(1, CHUNK_BYTES // max(1, per_expert))
    return triton.cdiv(num_ids, triton.cdiv(num_ids, most)) if num_ids else 1


def id_bound(num_ids: int, num_pairs: int, max_ids: int | None = None) -> int:
    """The most distinct ids a call of `num_pairs` pairs on a set of `num_ids` can use: one
    a pair, and at most `max_ids` (the caller's promise; None: any id of the set)."""
    bound = min(num_ids, num_pairs)
    return bound if max_ids is None else max(1, min(bound, max_ids))


def compact_ids(
    topk_ids: torch.Tensor, num_ids: int, bound: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Number the ids `topk_ids` (T, k) int32 contiguous uses 0, 1, ... in increasing id
    order, on the device (no host read): (experts (bound,) int32, the id of each number, -1
    past the last; local (T, k) int32, each pair's number). Where `bound` is the set's size
    every id keeps its own number (-1 for the unused: 3 small kernels, not ~15). A call using
    more than `bound` ids breaks the promise of `id_bound`: numbers from `bound` on are
    dropped and their pairs get -1 (left out, their outputs undefined), never an address
    outside the buffers."""
    dev = topk_ids.device
    flat = topk_ids.view(-1).long()
    if bound >= num_ids:
        experts = torch.full((num_ids,), -1, dtype=torch.int32, device=dev)
        return experts.scatter_(0, flat, topk_ids.view(-1)), topk_ids
    used = torch.zeros(num_ids, dtype=torch.int32, device=dev).index_fill_(0, flat, 1)
    number = torch.cumsum(used, 0) - 1  # (num_ids,) int64: the number of each used id
    place = torch.where((used > 0) & (number < bound), number, bound)  # bound: discarded
    experts = torch.full((bound + 1,), -1, dtype=torch.int32, device=dev)
    experts.scatter_(0, place, torch.arange(num_ids, dtype=torch.int32, device=dev))
    local = number[flat]
    local = torch.where(local < bound, local, -1).to(torch.int32).view(topk_ids.shape)
    return experts[:bound], local


def moe_merge_key(num_pairs: int, hidden: torch.Tensor, min_pairs: int) -> object | None:
    """The merge key (`WeightFormat.moe_merge_key`) of a format whose calls from `min_pairs`
    pairs take this route: a dequantized weight's bits depend on it alone and the grouped
    GEMMs' rows' bits only on the tiles, so calls with one key may be joined; the
    in-register kernels below `min_pairs` are never joined. One key for every format."""
    if not kernels.use_triton(hidden) or num_pairs < min_pairs:
        return None
    return ("dequant", moe_launch.grouped_config(num_pairs, hidden.dtype, hidden.device))


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    kw13: KernelWeights,
    kw2: KernelWeights,
    inter: int,
    config: moe_launch.MoeConfig | None = None,
    chunk: int | None = None,
    max_ids: int | None = None,
) -> torch.Tensor:
    """Routed experts on `[N, ...]` expert sets (experts or slots) of the shared quantized
    formats: `fused_moe_with` their dequantizer (`dequantize`)."""
    hidden_dim = hidden.shape[1]

    def deq13(out, first, ids):
        dequantize(kw13, 2 * inter, hidden_dim, out, first, ids)

    def deq2(out, first, ids):
        dequantize(kw2, hidden_dim, inter, out, first, ids)

    return fused_moe_with(
        hidden, topk_ids, topk_weights, kw13.w.shape[0], inter, deq13, deq2, config, chunk,
        max_ids=max_ids,
    )  # fmt: skip


# A dequantizer of one projection of an expert set: (out (count, N, K), first, ids) → out[j]
# = the dense copy of expert ids[first + j] (a negative id: out[j] left as it is).
Dequantizer = Callable[[torch.Tensor, int, torch.Tensor], None]


def fused_moe_with(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_ids: int,
    inter: int,
    deq13: Dequantizer,
    deq2: Dequantizer,
    config: moe_launch.MoeConfig | None = None,
    chunk: int | None = None,
    max_ids: int | None = None,
) -> torch.Tensor:
    """Routed experts on `[num_ids, ...]` expert sets of any format whose `deq13` / `deq2`
    write the dense w13 (2I, H) / w2 (H, I) copies, the ids the call uses dequantized `chunk`
    at a time (default `chunk_size` of their bound, `id_bound`): equal to
    `moe_launch.fused_moe` on the dequantized sets with the grouped path. `config`: the
    grouped GEMMs' tiles (default `grouped_config`). `max_ids`: at most this many distinct
    ids in `topk_ids` (a slot view's layer has E experts however many rows the view has);
    None: any number up to the set's size."""
    num_tokens, top_k = topk_ids.shape
    num_pairs, hidden_dim = num_tokens * top_k, hidden.shape[1]
    hidden, topk_ids, topk_weights, out = moe_launch.moe_inputs(hidden, topk_ids, topk_weights)
    if num_pairs == 0:
        return out
    cfg = config or moe_launch.grouped_config(num_pairs, hidden.dtype, hidden.device)
    bound = id_bound(num_ids, num_pairs, max_ids)
    chunk = min(bound, chunk or chunk_size(bound, hidden_dim, inter, hidden.dtype))
    experts, local = compact_ids(topk_ids, num_ids, bound)
    d13 = hidden.new_empty(chunk, 2 * inter, hidden_dim)
    d2 = hidden.new_empty(chunk, hidden_dim, inter)
    inter_buf = hidden.new_empty(num_pairs, inter)
    y = hidden.new_empty(num_pairs, hidden_dim)  # (T*k, H) unweighted, every row once
    for first in range(0, bound, chunk):
        count = min(chunk, bound - first)
        w13, w2 = d13[:count], d2[:count]
        deq13(w13, first, experts)
        deq2(w2, first, experts)
        pairs = local if count == bound else _chunk_ids(local, first, count)
        moe_launch.grouped_outputs(hidden, pairs, w13, w2, y, cfg, inter_buf)
    moe_launch._combine(y, topk_weights, out, top_k)
    return out


def _chunk_ids(topk_ids: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """Ids first .. first + count - 1 → 0 .. count - 1; every other id → -1 (left out)."""
    local = topk_ids - first
    return torch.where((local >= 0) & (local < count), local, -1)
