"""Programmatic dependent launch (Hopper and later), the kernel side: a kernel launched with
`launch_pdl` may start while the kernel before it on the stream is still running, so before
it touches memory it waits for that kernel to finish and flush (`griddepcontrol.wait`),
then lets the kernel after it start launching (`griddepcontrol.launch_dependents`). What it
saves is the gap between two short kernels: the next one's launch and its programs'
start-up overlap the last programs of this one. Compiled out unless USE_PDL (the launcher
sets it with `launch_pdl`: `xinfer.kernels.pdl.options`); the CPU interpreter never sets it.

While its programs sit at that wait, a dense decode linear may already ask L2 for the weight
bytes it is about to read (`prefetch_rows_l2`, before `wait_for_producers`): its weights do
not depend on the kernel it waits for, so they come from L2 instead of HBM once the wait
ends. Compiled out unless PREFETCH_L2 (the launcher sets it: `pdl.prefetch_options`)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_for_producers(USE_PDL: tl.constexpr):
    """First thing in a kernel that may be launched with PDL: wait until the kernel before it
    has finished and its writes are visible, then release the one after. Releasing after the
    wait keeps at most one kernel's programs waiting on the device at a time."""
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_span(rows, stride_w, e_lo, e_hi, BITS: tl.constexpr):
    """(start, size) int64 of each row's prefetch, in bytes from the weight's base: elements
    [e_lo, e_hi) of row `rows` of a weight of BITS-bit elements and row stride `stride_w`
    elements, rounded out to 16-byte boundaries but never past the row's stride (so never
    out of the allocation); size <= 0 where the range is empty. With the base and the
    stride in bytes multiples of 16 (the launcher's rule), start and size are too."""
    z = tl.zeros_like(rows).to(tl.int64)
    row_bytes = (z + stride_w) * BITS // 8
    lo = (z + e_lo) * BITS // 8 // 16 * 16
    hi = tl.minimum((((z + e_hi) * BITS + 7) // 8 + 15) // 16 * 16, row_bytes)
    return rows.to(tl.int64) * row_bytes + lo, hi - lo


@triton.jit
def bulk_prefetch_l2(addr, size):
    """`cp.async.bulk.prefetch.L2` of `size` bytes at each `addr` (int8 pointers; both
    multiples of 16), skipped where size <= 0. ptxas turns the per-thread op into a loop over
    a warp's distinct (addr, size) pairs (`UBLKPF.L2`): threads holding the same row cost
    nothing extra. Asks L2 to fetch, nothing more: no register of the arithmetic is touched,
    nothing waits for it."""
    size32 = size.to(tl.int32)
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred %pf;\n\tsetp.gt.s32 %pf, $2, 0;\n\t"
        "@%pf cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;\n\t}",
        "=r,l,r", [addr, size32], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def prefetch_rows_l2(w_ptr, rows, stride_w, e_lo, e_hi, ENABLED: tl.constexpr):
    """With ENABLED: prefetch into L2 elements [e_lo, e_hi) (w's own element type) of each
    row in the int tensor `rows` of the weight at `w_ptr` (row stride `stride_w` elements),
    rounded out to 16 bytes within the row's stride (`prefetch_span`). The caller clamps
    rows past N to a valid row (a duplicate costs nothing: `bulk_prefetch_l2`).

    Why: a decode linear launched with PDL has its programs resident on the SMs, parked at
    `wait_for_producers`, while the kernel before it still runs. Called before that wait, this
    overlaps the weights' HBM reads with the producer's tail; the linear then reads them
    from L2.

    Safety: only for memory that no kernel on the stream writes during decode — the weights
    of the dense linears (qkv, o_proj, the router, the LM head). Before the wait nothing of
    the producer's may be read: never expert weights chosen by ids the producer writes, nor
    activations. The launcher enables it only where the base pointer and the row stride in
    bytes are multiples of 16 (`cp.async.bulk.prefetch` needs 16-byte addresses and sizes):
    `xinfer.kernels.pdl.prefetch_options`."""
    if ENABLED:
        start, size = prefetch_span(
            rows, stride_w, e_lo, e_hi, w_ptr.dtype.element_ty.primitive_bitwidth
        )
        bulk_prefetch_l2(w_ptr.to(tl.pointer_type(tl.int8)) + start, size)
