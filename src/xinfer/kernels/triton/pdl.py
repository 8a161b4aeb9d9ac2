"""Programmatic dependent launch (Hopper and later), the kernel side: a kernel launched with
`launch_pdl` may start while the kernel before it on the stream is still running, so before
it touches memory it waits for that kernel to finish and flush (`griddepcontrol.wait`),
then lets the kernel after it start launching (`griddepcontrol.launch_dependents`). What it
saves is the gap between two short kernels: the next one's launch and its programs'
start-up overlap the last programs of this one. Compiled out unless USE_PDL (the launcher
sets it with `launch_pdl`: `xinfer.kernels.pdl.options`); the CPU interpreter never sets it."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_for_producers(USE_PDL: tl.constexpr, RELEASE_FIRST: tl.constexpr = False):
    """First thing in a kernel that may be launched with PDL: wait until the kernel before it
    has finished and its writes are visible, then release the one after. Releasing after the
    wait keeps at most one kernel's programs waiting on the device at a time.

    RELEASE_FIRST (short kernels before a dense linear: `xinfer.kernels.pdl.EARLY_RELEASE`):
    release the next kernel first, then wait. Still correct, because the next kernel's own
    wait is for this one to finish, and this one finishes only after its wait; what changes
    is how early the next kernel's programs sit on the SMs: from the start of the kernel
    before this one instead of from its end, time in which a dense linear prefetches its
    weights into L2 (`prefetch_rows_l2`)."""
    if USE_PDL:
        if RELEASE_FIRST:
            gdc_launch_dependents()
            gdc_wait()
        else:
            gdc_wait()
            gdc_launch_dependents()
