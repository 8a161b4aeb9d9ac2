"""Host → GPU bandwidth of the offload `fill` kernel (zero-copy reads of mapped pinned
memory) against the copy engine (`copy_(non_blocking=True)` from pinned memory).

Shape: Qwen3-30B-A3B bf16 experts (w13 1536x2048 + w2 2048x768 = 9.44 MB), 8 misses per
call. Checks the bytes first, then times: the fill kernel eagerly and inside a CUDA graph
(miss count read from device memory), lookup + fill in a graph with every id a miss, and
the copy engine. Prints a table last; `--json PATH` also writes the numbers.

    python3 bench/bench_offload_fill.py [--experts 32] [--misses 8] [--reps 50]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from cuda_timing import cuda_seconds as cuda_time  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from xinfer.offload import kernels as offload_kernels  # noqa: E402
from xinfer.offload.host_store import HostExpertStore  # noqa: E402
from xinfer.offload.slot_cache import SlotCache  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--misses", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    E, M, H, inter = args.experts, args.misses, args.hidden, args.inter
    host_set = {
        "w13": torch.randn(E, 2 * inter, H).to(torch.bfloat16),
        "w2": torch.randn(E, H, inter).to(torch.bfloat16),
    }
    store = HostExpertStore(dev)
    host = store.add_layer(host_set)  # pinned after fill, mapped
    cache = SlotCache(host, M, dev, torch.zeros(4, dtype=torch.int64, device=dev))
    expert_bytes = cache.expert_bytes
    moved = M * expert_bytes
    print(f"{E} experts of {expert_bytes / 1e6:.2f} MB pinned; {M} misses = {moved / 1e6:.1f} MB")

    # A fixed miss list: experts M..2M-1 into slots 0..M-1 (what lookup would write).
    cache.miss_ids.copy_(torch.arange(M, 2 * M, dtype=torch.int32))
    cache.miss_slots.copy_(torch.arange(M, dtype=torch.int32))
    cache.miss_count.fill_(M)

    def fill(**kw):
        offload_kernels.fill(cache, host, M, **kw)

    fill()
    torch.cuda.synchronize()
    for name, t in host.items():  # correctness first
        assert torch.equal(cache.slots[name].cpu(), t[M : 2 * M]), name
    print("fill bytes verified")

    rows: list[tuple[str, float]] = []
    for chunks in (None, 16, 32, 66, 132):
        for block in (1024, 2048, 4096):
            t = cuda_time(lambda c=chunks, b=block: fill(num_chunks=c, block=b), args.reps)
            label = f"fill kernel, chunks={chunks or 'auto'}, block={block}"
            rows.append((label, moved / t / 1e9))

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fill()
    t = cuda_time(graph.replay, args.reps)
    rows.append(("fill kernel in a CUDA graph (count from device)", moved / t / 1e9))

    # lookup + fill in a graph, alternating two disjoint sets of M experts: every id misses.
    cache2 = SlotCache(host, M, dev, torch.zeros(4, dtype=torch.int64, device=dev))
    sets = [torch.arange(M, dtype=torch.int32), torch.arange(M, 2 * M, dtype=torch.int32)]
    static_ids = sets[0].view(1, M).to(dev)
    offload_kernels.lookup(SlotCache(host, M, dev, cache2.counters.clone()), static_ids)
    torch.cuda.synchronize()
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        offload_kernels.lookup(cache2, static_ids)
        offload_kernels.fill(cache2, host, M)
    step = [0]

    def replay_all_miss() -> None:
        static_ids.copy_(sets[step[0] % 2].view(1, M), non_blocking=True)
        step[0] += 1
        g2.replay()

    t = cuda_time(replay_all_miss, args.reps)
    assert int(cache2.counters[0]) == 0, "expected every id to miss"
    rows.append(("lookup + fill in a CUDA graph, all 8 miss", moved / t / 1e9))

    # Copy engine from the same registered memory, and from torch's pinned allocator.
    def copy_engine(src: dict[str, torch.Tensor]) -> None:
        for name, t in src.items():
            dst = cache.slots[name]
            for m in range(M):
                dst[m].copy_(t[M + m], non_blocking=True)

    t = cuda_time(lambda: copy_engine(host), args.reps)
    rows.append(("copy_(non_blocking) per expert, registered memory", moved / t / 1e9))
    pinned = {k: v.pin_memory() for k, v in host_set.items()}
    t = cuda_time(lambda: copy_engine(pinned), args.reps)
    rows.append(("copy_(non_blocking) per expert, pin_memory()", moved / t / 1e9))
    store.close()

    gpu = torch.cuda.get_device_name(dev)
    print(f"\nhost → GPU, {M} experts of {expert_bytes / 1e6:.2f} MB ({gpu})")
    print(f"| {'method':<58} | GB/s  |\n|{'-' * 60}|-------|")
    for label, gbs in rows:
        print(f"| {label:<58} | {gbs:5.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(rows), indent=1))


if __name__ == "__main__":
    main()
