"""Host → GPU bandwidth, measured once per benchmark in a subprocess of its own (so that its
CUDA context does not sit on the GPU under test): the copy engine (pinned
`copy_(non_blocking=True)`) for expert-sized and large blocks, and the offload fill kernel
(zero-copy gather from mapped pinned memory) when `xinfer.offload` provides it. Prints JSON.

    python3 bench/offload_bench/bandwidth.py [--expert-mb 9.44] [--device 0]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: cuda_timing


def slow_host_note(bw: dict) -> str:
    """A warning sentence when `bw` (measure's dict) shows a slow host, else ''. The rule is
    the engine's start-up check's (xinfer/offload/link_check.py): on the H100s lent so far
    the fill kernel read 47.9-50.9 GB/s (0.87-0.92 of the copy engine's 55) on most hosts
    and 27-34 (0.5-0.62) on a few, where every offload row ran 20-35% slower
    (docs/benchmarks.md, 2026-12-05 and 2026-12-06)."""
    from xinfer.offload.link_check import is_slow_host

    fill, engine = bw.get("fill_kernel_gbps"), bw.get("copy_engine_block_gbps")
    if not is_slow_host(fill, engine):
        return ""
    host_alloc = bw.get("fill_kernel_hostalloc_gbps")
    also = f" ({host_alloc:.1f} from cudaHostAlloc memory)" if host_alloc else ""
    return (
        f"SLOW HOST: the fill kernel read host memory at {fill:.1f} GB/s{also}, "
        f"{fill / engine:.2f} of the copy engine's {engine:.1f} (healthy hosts: ~0.9); "
        "offload rows from this host are not comparable with a healthy host's"
    )


def copy_engine_gbps(dev, nbytes: int, num_blocks: int, reps: int) -> float:
    """GB/s of `num_blocks` pinned host blocks of `nbytes` copied to the GPU per call."""
    import torch
    from cuda_timing import cuda_seconds

    src = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(num_blocks)]
    dst = [torch.empty(nbytes, dtype=torch.uint8, device=dev) for _ in range(num_blocks)]

    def copy() -> None:
        for d, s in zip(dst, src):
            d.copy_(s, non_blocking=True)

    return num_blocks * nbytes / cuda_seconds(copy, reps) / 1e9


def fill_kernel_gbps(
    dev, expert_bytes: int, num_misses: int, reps: int, host_alloc: bool = False
) -> float:
    """GB/s of the offload fill kernel copying `num_misses` experts into slots (the decode
    path), set up like bench/bench_offload_fill.py: from the host store's memory (as the
    engine allocates it), or with `host_alloc` from torch's pinned allocation
    (`cudaHostAlloc`: on a slow host, 2026-12-06, the fill kernel read it no faster, 33.4-33.7
    GB/s against 34.1 from the store's registered memory)."""
    import torch
    from cuda_timing import cuda_seconds

    from xinfer.offload import kernels as offload_kernels
    from xinfer.offload.host_store import HostExpertStore
    from xinfer.offload.slot_cache import SlotCache

    num_experts = 4 * num_misses
    cols = max(1, expert_bytes // 2 // 2048)  # bf16 rows of 2048
    store = HostExpertStore(dev)  # (holds nothing with `host_alloc`)
    experts = torch.zeros(num_experts, 2048, cols, dtype=torch.bfloat16)
    host = {"w": experts.pin_memory()} if host_alloc else store.add_layer({"w": experts})
    cache = SlotCache(host, num_misses, dev)
    cache.miss_ids[:num_misses].copy_(torch.arange(num_misses, 2 * num_misses, dtype=torch.int32))
    cache.miss_slots[:num_misses].copy_(torch.arange(num_misses, dtype=torch.int32))
    cache.miss_count.fill_(num_misses)
    seconds = cuda_seconds(lambda: offload_kernels.fill(cache, host), reps)
    moved = num_misses * cache.expert_bytes
    store.close()
    return moved / seconds / 1e9


def measure(expert_mb: float, device: int, reps: int = 20) -> dict:
    """The numbers as a dict; `cuda: false` (and nothing else) without a CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return {"cuda": False}
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    expert_bytes = int(expert_mb * 1e6)
    out: dict = {"cuda": True, "gpu": torch.cuda.get_device_name(dev), "expert_mb": expert_mb}
    out["copy_engine_expert_gbps"] = copy_engine_gbps(dev, expert_bytes, 8, reps)
    out["copy_engine_block_gbps"] = copy_engine_gbps(dev, 512 << 20, 1, max(3, reps // 4))
    try:
        out["fill_kernel_gbps"] = fill_kernel_gbps(dev, expert_bytes, 8, reps)
        # the same from cudaHostAlloc memory: whether a slow host's SM reads depend on the kind
        # of pinned memory (on the one measured, 2026-12-06, they did not)
        out["fill_kernel_hostalloc_gbps"] = fill_kernel_gbps(
            dev, expert_bytes, 8, reps, host_alloc=True
        )
    except Exception as e:  # noqa: BLE001 - the fill kernel is optional here
        out.setdefault("fill_kernel_gbps", None)
        out["fill_kernel_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--expert-mb", type=float, default=9.44)
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()
    print(json.dumps(measure(args.expert_mb, args.device)))


if __name__ == "__main__":
    main()
