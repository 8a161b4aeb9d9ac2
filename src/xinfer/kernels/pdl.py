"""Programmatic dependent launch (PDL), the launcher side: `options(t)` gives the launch
keywords that let a decode kernel start while the kernel before it finishes (its programs
wait on the device instead: `triton/pdl.py`). Batch-1 decode is a chain of ~9 short kernels
a layer (2-30 µs each) whose launch gaps are ~7% of the step (trace, fifteenth session);
PDL overlaps each launch with the previous kernel's tail. Only kernels whose first act is
`wait_for_producers` may take these options: one that does not could read its inputs
before they are written.

On by default since the thirtieth session: the H100 showed the same bits with and without it
(eager and in CUDA graphs, tests/kernels/test_pdl_gpu.py) and +7.4% (bf16) / +8.7% (GPTQ)
batch-1 decode on the Qwen3-30B-A3B shape (bench/bench_decode_switches.py). `XINFER_PDL=0`
(read once, when an engine starts: `Engine` sets ENABLED) or `ENABLED = False` here switches
it off. `options` runs at every kernel launch: the switch is a module flag, not a variable
read there."""

from __future__ import annotations

import functools
import logging

import torch

ENABLED = True
logger = logging.getLogger("xinfer")


@functools.cache
def _hopper_or_later(index: int) -> bool:
    major, minor = torch.cuda.get_device_capability(index)
    if major < 9:
        logger.info("XINFER_PDL has no effect on sm_%d%d: PDL needs sm_90 or later", major, minor)
    return major >= 9


def options(t: torch.Tensor) -> dict:
    """Launch keywords for a kernel (that starts with `wait_for_producers`) on t's device:
    PDL where it is on and the GPU has it (sm_90+), else none (the kernel's default
    USE_PDL=False compiles the wait out)."""
    if not ENABLED or t.device.type != "cuda":
        return {}
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if not _hopper_or_later(index):
        return {}
    return {"USE_PDL": True, "launch_pdl": True}
