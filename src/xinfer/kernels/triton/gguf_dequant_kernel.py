"""Triton kernel that dequantizes GGUF block rows, one weight (N, row bytes) or experts of an
`[E, N, row bytes]` set, into a dense copy in the activation dtype (launched from
`xinfer.kernels.gguf_launch` for prefill-sized calls). Each weight is computed by
`gguf_dequant.gguf_tile` in float32, as the twin (`quant/gguf_blocks.py`) computes it, then
rounded once to the output dtype; elementwise, so the tiles do not change the bits."""

from __future__ import annotations

import triton
import triton.language as tl

from xinfer.kernels.triton.gguf_dequant import gguf_tile
from xinfer.kernels.triton.quant_dequant_kernel import expert_of


@triton.jit(do_not_specialize=["first"])
def gguf_dequant_kernel(
    w_ptr, ids_ptr, out_ptr,
    first, N, K,
    stride_we, stride_wn, stride_oe, stride_on,
    BTYPE: tl.constexpr, GATHER: tl.constexpr, BLOCK_N: tl.constexpr, SUBS: tl.constexpr,
):  # fmt: skip
    """grid (cdiv(N, BLOCK_N), cdiv(K, SUBS * 32), count): out[j] = dequant(W[first + j]) for
    the `count` experts from `first`; GATHER: out[j] = dequant(W[ids[first + j]]) (`ids`
    int32), a negative id skipped, its rows of `out` left as they are. K is a multiple of 32
    (every GGUF block type's rows are whole blocks of 32 or 256)."""
    pid_n = tl.program_id(0)
    kb = tl.program_id(1)
    j = tl.program_id(2).to(tl.int64)
    e = expert_of(ids_ptr, first, j, GATHER)
    if e < 0:
        return
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    row_off = e * stride_we + offs_n.to(tl.int64) * stride_wn
    w = gguf_tile(w_ptr, row_off, kb, K, mask_n, BTYPE, SUBS)  # (BLOCK_N, SUBS, 32) float32
    w = tl.reshape(w, (BLOCK_N, SUBS * 32))
    offs_k = kb * SUBS * 32 + tl.arange(0, SUBS * 32)
    out_ptrs = out_ptr + j * stride_oe + offs_n.to(tl.int64)[:, None] * stride_on + offs_k[None, :]
    tl.store(out_ptrs, w.to(out_ptr.dtype.element_ty), mask=mask_n[:, None] & (offs_k < K)[None, :])
