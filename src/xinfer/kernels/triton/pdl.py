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
def wait_for_producers(USE_PDL: tl.constexpr):
    """First thing in a kernel that may be launched with PDL: wait until the kernel before it
    has finished and its writes are visible, then release the one after. Releasing after the
    wait keeps at most one kernel's programs waiting on the device at a time."""
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
