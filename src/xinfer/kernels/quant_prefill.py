"""The prefill path of the quantized formats: dequantize the weight to the activation dtype
(`triton/quant_dequant_kernel.py`), then run the bf16 kernels the unquantized model runs
(`kernels.linear`: cuBLAS at these sizes; `moe_launch`'s grouped GEMMs). The twins
dequantize to the activation dtype and then multiply, so this is the twin's math exactly:
the dequantized weight has the twin's bits, and the bf16 kernels then give the bits that
they give an unquantized model holding those weights. Launched from `quant_launch` from
PREFILL_MIN_ROWS rows (linears) and PREFILL_MIN_PAIRS (token, k) pairs (routed experts).

Cost: the dequantization moves the stored bytes once and writes the dense copy once, per
call. Linears dequantize the whole weight (a transient N x K copy; one F.linear keeps the
twin's bits). Experts are dequantized in chunks of `chunk` ids into one reused buffer of at
most CHUNK_BYTES, each chunk's pairs running the grouped GEMMs (the other pairs' ids set to
-1, which `align_pairs` leaves out) into one (T*k, H) buffer of unweighted outputs that is
combined once at the end, in k order: bits do not depend on the chunking. Experts no pair
uses are skipped (a device flag per id), so a call moves only what it touches.

For Qwen3-30B-A3B (128 experts, H 2048, I 768) a 2048-token prefill touches all of them: per
layer 0.6 GB of FP8 read and 1.2 GB of bf16 written, ~0.4 ms at ~4.5 TB/s, beside ~0.15
TFLOP of grouped GEMM; acceptable for prefill, where the in-register GEMMs re-dequantize
every weight tile for each tile of rows. Each touched weight costs its stored bytes plus
2 + 2 bf16 bytes (written, read back): ~5x the bytes of an in-register pass for FP8, ~9x for
4-bit, which is what decode-sized calls would pay; hence `quant_launch`'s size bounds.

No host sync (fixed shapes, flags and ids remapped on the device): safe in CUDA graphs."""

from __future__ import annotations

import torch
import triton

from xinfer import kernels
from xinfer.kernels import moe_launch
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
    used: torch.Tensor | None = None,
) -> torch.Tensor:
    """Experts first .. first + len(out) of the `[E, ...]` set `kw` (N, K each) → `out`
    (count, N, K), contiguous rows, in its dtype. `used` (E,) int8: experts flagged 0 are
    skipped and their rows of `out` left as they are."""
    count = out.shape[0]
    if count == 0 or n == 0 or k == 0:
        return out
    z = kw.z if kw.z is not None else kw.s
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(k, BLOCK_K), count)
    jit.dequant_kernel[grid](
        kw.w, kw.s, z, used if used is not None else kw.s, out,
        first, n, k,
        kw.w.stride(0), kw.w.stride(1), kw.s.stride(0), kw.s.stride(1),
        z.stride(0), z.stride(1), out.stride(0), out.stride(1),
        FMT=kw.fmt_code, SCALE_BN=kw.scale_bn, SCALE_BK=kw.scale_bk, HAS_ZERO=kw.has_zero,
        USE_FLAGS=used is not None, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        GROUP_T=group_t(kw, BLOCK_K, k), num_warps=4,
    )  # fmt: skip
    return out


def dequantize_weight(kw: KernelWeights, n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """One (N, K) weight → its dense copy in `dtype` (an expert set of one)."""
    one = KernelWeights(
        kw.fmt_code, kw.w.unsqueeze(0), kw.s.unsqueeze(0),
        None if kw.z is None else kw.z.unsqueeze(0), kw.scale_bn, kw.scale_bk, kw.has_zero,
    )  # fmt: skip
    out = torch.empty(1, n, k, dtype=dtype, device=kw.w.device)
    return dequantize(one, n, k, out)[0]


def linear(x2: torch.Tensor, kw: KernelWeights, bias: torch.Tensor | None, n: int, k: int):
    """x2 (M, K) @ W^T (+ bias) → (M, N): W dequantized to x2's dtype, then the linear of
    the unquantized model."""
    return kernels.linear(x2, dequantize_weight(kw, n, k, x2.dtype), bias)


def chunk_size(num_ids: int, hidden_dim: int, inter: int, dtype: torch.dtype) -> int:
    """Experts per chunk: the most whose dense w13 and w2 fit CHUNK_BYTES, evened out over
    the chunks that `num_ids` needs (at least one)."""
    per_expert = 3 * inter * hidden_dim * torch.empty((), dtype=dtype).element_size()
    most = max(1, CHUNK_BYTES // max(1, per_expert))
    return triton.cdiv(num_ids, triton.cdiv(num_ids, most)) if num_ids else 1


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    kw13: KernelWeights,
    kw2: KernelWeights,
    inter: int,
    config: moe_launch.MoeConfig | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Routed experts on `[N, ...]` expert sets (experts or slots) dequantized `chunk` ids at
    a time (default `chunk_size`): equal to `moe_launch.fused_moe` on the dequantized sets
    with the grouped path. `config`: the grouped GEMMs' tiles (default `grouped_config`)."""
    num_tokens, top_k = topk_ids.shape
    num_pairs, hidden_dim = num_tokens * top_k, hidden.shape[1]
    num_ids = kw13.w.shape[0]
    hidden, topk_ids, topk_weights, out = moe_launch.moe_inputs(hidden, topk_ids, topk_weights)
    if num_pairs == 0:
        return out
    cfg = config or moe_launch.grouped_config(num_pairs, hidden.dtype)
    chunk = min(num_ids, chunk or chunk_size(num_ids, hidden_dim, inter, hidden.dtype))
    flat_ids = topk_ids.view(-1).long()
    used = torch.zeros(num_ids, dtype=torch.int8, device=hidden.device).index_fill_(0, flat_ids, 1)
    d13 = hidden.new_empty(chunk, 2 * inter, hidden_dim)
    d2 = hidden.new_empty(chunk, hidden_dim, inter)
    inter_buf = hidden.new_empty(num_pairs, inter)
    y = hidden.new_empty(num_pairs, hidden_dim)  # (T*k, H) unweighted, every row once
    for first in range(0, num_ids, chunk):
        count = min(chunk, num_ids - first)
        w13, w2 = d13[:count], d2[:count]
        dequantize(kw13, 2 * inter, hidden_dim, w13, first, used)
        dequantize(kw2, hidden_dim, inter, w2, first, used)
        ids = topk_ids if count == num_ids else _chunk_ids(topk_ids, first, count)
        moe_launch.grouped_outputs(hidden, ids, w13, w2, y, cfg, inter_buf)
    moe_launch._combine(y, topk_weights, out, top_k)
    return out


def _chunk_ids(topk_ids: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """Ids first .. first + count - 1 → 0 .. count - 1; every other id → -1 (left out)."""
    local = topk_ids - first
    return torch.where((local >= 0) & (local < count), local, -1)
