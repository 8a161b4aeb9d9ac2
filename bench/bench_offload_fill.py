"""Host → GPU bandwidth of the offload `fill` kernel (zero-copy reads of mapped pinned
memory) against the copy engine, and the fixed cost of the offload machinery per MoE layer.

Shape: Qwen3-30B-A3B bf16 experts (w13 1536x2048 + w2 2048x768 = 9.44 MB, both tensors in
one fill launch). Checks the bytes first, then times:
- the fill kernel with 1, 2 and 8 misses a call over a sweep of grid sizes (programs per
  SM), block sizes and warps, eagerly; the default config inside a CUDA graph;
- lookup + fill in a graph with every id a miss;
- the machinery alone: lookup + fill for 48 layers (one slot cache each) in one CUDA graph,
  every id a hit, and one miss a layer: microseconds per layer, by lookup warps;
- the copy engine (`copy_(non_blocking=True)` per expert tensor).
`--host-memory` times the fill kernel and the copy engine from three kinds of pinned host memory
(registered 4 KiB pages, registered transparent huge pages — the host store's default —, and
torch's `pin_memory` allocation, cudaHostAlloc). `--packed` times the fill of packed experts (`--moe-offload-compress`) against the plain fill
of the same experts. `--variants` times instead the candidate fill schemes of `offload_fill_variants.py` (wider
loads, cache hints, pipelined loads, TMA) against the production kernel and the copy engine
(eager, and captured in a graph with fixed addresses: the ceiling), 1 and 8 misses, all in
CUDA graphs, bytes checked first. Prints tables last; `--json PATH` also writes the numbers.

    python3 bench/bench_offload_fill.py [--experts 32] [--reps 30] [--variants]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from cuda_timing import cuda_seconds as cuda_time  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from xinfer.offload import kernels as offload_kernels  # noqa: E402
from xinfer.offload.host_store import HostExpertStore  # noqa: E402
from xinfer.offload.slot_cache import SlotCache  # noqa: E402


def graphed(fn):
    """`fn` captured in a CUDA graph (after one eager warm-up call); returns its replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def fill_sweep(host, dev, reps: int) -> list[tuple[str, float]]:
    """GB/s of the fill kernel by misses a call and launch config (eager)."""
    rows = []
    for misses in (1, 2, 8):
        cache = SlotCache(host, 8, dev)
        cache.miss_ids[:8].copy_(torch.arange(8, 16, dtype=torch.int32))
        cache.miss_slots[:8].copy_(torch.arange(8, dtype=torch.int32))
        cache.miss_count.fill_(misses)
        moved = misses * cache.expert_bytes
        offload_kernels.fill(cache, host)
        torch.cuda.synchronize()
        for name, t in host.items():  # correctness first
            assert torch.equal(cache.slots[name][:misses].cpu(), t[8 : 8 + misses]), name
        for per_sm in (2, 4, 8):
            programs = offload_kernels.fill_grid(dev, per_sm)
            for block in (1024, 2048, 4096):
                for warps in (4, 8):
                    sec = cuda_time(
                        lambda c=cache, p=programs, b=block, w=warps: offload_kernels.fill(
                            c, host, num_programs=p, block=b, num_warps=w
                        ),
                        reps,
                    )
                    label = f"{misses} miss, {per_sm}/SM, block {block}, {warps} warps"
                    rows.append((label, moved / sec / 1e9))
        sec = cuda_time(graphed(lambda c=cache: offload_kernels.fill(c, host)), reps)
        rows.append((f"{misses} miss, default, in a CUDA graph", moved / sec / 1e9))
    return rows


def all_miss_graph(host, dev, misses: int, reps: int) -> float:
    """GB/s of lookup + fill in a CUDA graph, alternating two disjoint expert sets."""
    cache = SlotCache(host, misses, dev)
    sets = [torch.arange(misses, dtype=torch.int32), torch.arange(misses, 2 * misses)]
    static_ids = sets[0].view(1, misses).to(torch.int32).to(dev)
    replay = graphed(
        lambda: (offload_kernels.lookup(cache, static_ids), offload_kernels.fill(cache, host))
    )
    step = [1]  # the warm-up call in `graphed` loaded set 0

    def replay_all_miss() -> None:
        static_ids.copy_(sets[step[0] % 2].view(1, misses), non_blocking=True)
        step[0] += 1
        replay()

    sec = cuda_time(replay_all_miss, reps)
    assert int(cache.counters[0]) == 0, "expected every id to miss"
    return misses * cache.expert_bytes / sec / 1e9


def machinery(host, dev, reps: int, warps: int, layers=48, slots=45, top_k=8):
    """Microseconds per layer of lookup + fill, `layers` slot caches in one CUDA graph:
    (every id a hit, one miss a layer). The second includes copying one expert."""
    caches = [SlotCache(host, slots, dev, num_overflow=0) for _ in range(layers)]
    ids = torch.arange(top_k, dtype=torch.int32, device=dev).view(1, top_k)
    for cache in caches:  # make the hot set resident
        offload_kernels.lookup(cache, ids)
        offload_kernels.fill(cache, host)

    def step() -> None:
        for cache in caches:
            offload_kernels.lookup(cache, ids, num_warps=warps)
            offload_kernels.fill(cache, host)

    replay = graphed(step)
    hit_us = cuda_time(replay, reps) * 1e6 / layers
    assert all(int(c.miss_count) == 0 for c in caches)
    # One miss a layer: the last id cycles through more experts than there are free slots.
    cold = list(range(top_k, host["w13"].shape[0]))
    n = [0]

    def one_miss() -> None:
        ids[0, -1] = cold[n[0] % len(cold)]
        n[0] += 1
        replay()

    miss_us = cuda_time(one_miss, reps) * 1e6 / layers
    assert all(int(c.miss_count) == 1 for c in caches)
    return warps, hit_us, miss_us


def variant_rows(dev, reps: int, row_mb: float = 9.44) -> list[tuple[str, float]]:
    """GB/s of each fill variant in a CUDA graph (1 and 8 misses of `row_mb` MB experts)."""
    import offload_fill_variants as fv
    import triton

    row_words = int(row_mb * 1e6) // 4 // 256 * 256  # a multiple of every block below
    num_experts = 16
    store = HostExpertStore(dev)
    host = torch.randint(-(2**31), 2**31 - 1, (num_experts, row_words), dtype=torch.int32)
    src = store.add_layer({"w": host})["w"]  # pinned after fill, mapped
    dst = torch.empty(8, row_words, dtype=torch.int32, device=dev)
    miss_ids = torch.arange(8, 16, dtype=torch.int32, device=dev)
    miss_slots = torch.arange(8, dtype=torch.int32, device=dev)
    count = torch.zeros(1, dtype=torch.int32, device=dev)
    mapped = offload_kernels.MappedWords(src, torch.int32)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev)
    )
    args = (mapped, dst, row_words, miss_ids, miss_slots, count)
    variants = {"production fill_kernel (1 tensor)": None}
    for per_sm, block, warps in ((4, 2048, 4), (2, 4096, 8), (8, 1024, 4)):
        grid = (per_sm * sms,)
        tag = f"{per_sm}/SM, block {block}, {warps} warps"
        variants[f"words, {tag}"] = lambda g=grid, b=block, w=warps: fv.fill_words[g](
            *args, BLOCK=b, num_warps=w
        )
        for cache, evict, name in (
            ("", "", "vec4"),
            (".cg", "", "cg"),
            ("", "evict_first", "stream"),
        ):
            variants[f"{name}, {tag}"] = lambda g=grid, b=block, w=warps, c=cache, e=evict: (
                fv.fill_vec4[g](*args, BLOCK=b, CACHE=c, EVICT=e, num_warps=w)
            )
        variants[f"pipelined x4, {tag}"] = lambda g=grid, b=block, w=warps: fv.fill_pipelined[g](
            *args, BLOCK=b, STAGES=4, num_warps=w
        )
    for block_r in (8, 32):
        variants[f"tma ({block_r} x 256 words), 4/SM"] = lambda br=block_r: fv.fill_tma[
            (4 * sms,)
        ](mapped, dst, num_experts, row_words, miss_ids, miss_slots, count,
          BLOCK_R=br, BLOCK_C=256, num_warps=4)  # fmt: skip
    cache = SlotCache({"w": src}, 8, dev, num_overflow=0)
    cache.miss_ids[:8].copy_(miss_ids)
    cache.miss_slots[:8].copy_(miss_slots)
    rows = []
    for misses in (1, 8):  # the ceilings first (the copy engine)

        def engine(n=misses) -> None:
            for m in range(n):
                dst[m].copy_(src[8 + m], non_blocking=True)

        moved = misses * row_words * 4
        rows.append((f"{misses} miss, copy engine, eager", moved / cuda_time(engine, reps) / 1e9))
        gbs = moved / cuda_time(graphed(engine), reps) / 1e9
        rows.append((f"{misses} miss, copy engine, graph (fixed addresses)", gbs))
    # TMA last: a variant the driver refuses may leave the context unusable.
    for label, fn in variants.items():
        out = dst
        if fn is None:
            fn = lambda: offload_kernels.fill(cache, {"w": src})  # noqa: E731
            out = cache.slots["w"]
        for misses in (1, 8):
            count.fill_(misses)
            cache.miss_count.fill_(misses)
            moved = misses * row_words * 4
            try:
                out.zero_()
                fn()
                torch.cuda.synchronize()
                assert torch.equal(out[:misses].cpu(), src[8 : 8 + misses]), "wrong bytes"
                gbs = moved / cuda_time(graphed(fn), reps) / 1e9
            except Exception as exc:  # a variant the compiler or driver refuses: say so
                print(f"{label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                gbs = float("nan")
            rows.append((f"{misses} miss, {label}", gbs))
    store.close()
    return rows


def packed_rows(dev, reps: int, experts: int = 32) -> list[tuple[str, float, float]]:
    """`--moe-offload-compress`: the fill of packed experts (N(0, 0.02) bf16, the Qwen3-30B-A3B
    expert shape) against the plain fill of the same experts, in CUDA graphs, 1 / 2 / 8
    misses a call, by programs per SM; bits checked first. Rows: (label, GB/s of bytes that
    crossed the link, GB/s of bf16 bytes delivered to the slots)."""
    from xinfer.offload.packed import pack_layer, stored_row_bytes

    plain_set = {
        "w13": (torch.randn(experts, 2 * 768, 2048) * 0.02).to(torch.bfloat16),
        "w2": (torch.randn(experts, 2048, 768) * 0.02).to(torch.bfloat16),
    }
    packed_set = pack_layer(plain_set)
    store = HostExpertStore(dev)
    sets = {"plain": store.add_layer(plain_set), "packed": store.add_layer(packed_set)}
    rows = []
    for kind, host in sets.items():
        cache = SlotCache(host, 8, dev)
        link = sum(stored_row_bytes(t) for t in host.values())
        for misses in (1, 2, 8):
            cache.miss_ids[:8].copy_(torch.arange(8, 16, dtype=torch.int32))
            cache.miss_slots[:8].copy_(torch.arange(8, dtype=torch.int32))
            cache.miss_count.fill_(misses)
            offload_kernels.fill(cache, host)
            torch.cuda.synchronize()
            for name, t in plain_set.items():  # bit for bit, packed or not
                got = cache.slots[name][:misses].cpu().view(torch.int16)
                assert torch.equal(got, t[8 : 8 + misses].view(torch.int16)), (kind, name)
            for per_sm in (2, 4, 8):
                programs = offload_kernels.fill_grid(dev, per_sm)

                def fn(c=cache, h=host, p=programs) -> None:
                    offload_kernels.fill(c, h, num_programs=p)

                sec = cuda_time(graphed(fn), reps)
                label = f"{kind}, {misses} miss, {per_sm}/SM, in a CUDA graph"
                rows.append(
                    (label, misses * link / sec / 1e9, misses * cache.expert_bytes / sec / 1e9)
                )
    store.close()
    return rows


def host_memory_rows(dev, reps: int, row_mb: float = 9.44) -> list[tuple[str, float]]:
    """GB/s of the fill kernel (in a CUDA graph) and of the copy engine (eager, an expert a
    copy) reading 1 and 8 experts of `row_mb` MB from each kind of pinned host memory; bits
    checked first."""
    import os

    row_words = int(row_mb * 1e6) // 4
    data = torch.randint(-(2**31), 2**31 - 1, (16, row_words), dtype=torch.int32)
    rows = []
    before = os.environ.get("XINFER_HOST_HUGE_PAGES")
    try:
        for kind in ("4 KiB pages, registered", "huge pages, registered", "cudaHostAlloc"):
            store = HostExpertStore(dev)
            if kind == "cudaHostAlloc":
                src = torch.empty_like(data, pin_memory=True)
                src.copy_(data)
            else:
                os.environ["XINFER_HOST_HUGE_PAGES"] = "1" if kind.startswith("huge") else "0"
                src = store.add_layer({"w": data.clone()})["w"]
            cache = SlotCache({"w": src}, 8, dev, num_overflow=0)
            cache.miss_ids[:8].copy_(torch.arange(8, 16, dtype=torch.int32))
            cache.miss_slots[:8].copy_(torch.arange(8, dtype=torch.int32))
            for misses in (1, 8):
                cache.miss_count.fill_(misses)
                moved = misses * row_words * 4
                label = f"{kind}: fill kernel, {misses} miss, in a CUDA graph"
                try:
                    cache.slots["w"].zero_()
                    offload_kernels.fill(cache, {"w": src})
                    torch.cuda.synchronize()
                    assert torch.equal(cache.slots["w"][:misses].cpu(), data[8 : 8 + misses])
                    fn = lambda c=cache, h=src: offload_kernels.fill(c, {"w": h})  # noqa: E731
                    rows.append((label, moved / cuda_time(graphed(fn), reps) / 1e9))
                except Exception as exc:  # say what refused, keep the other rows
                    print(f"{label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    rows.append((label, float("nan")))

                def engine(n=misses, c=cache, h=src) -> None:
                    for m in range(n):
                        c.slots["w"][m].copy_(h[8 + m], non_blocking=True)

                gbs = moved / cuda_time(engine, reps) / 1e9
                rows.append((f"{kind}: copy engine, {misses} experts, eager", gbs))
            store.close()
    finally:  # the environment as it was, whatever failed
        if before is None:
            os.environ.pop("XINFER_HOST_HUGE_PAGES", None)
        else:
            os.environ["XINFER_HOST_HUGE_PAGES"] = before
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=str, default=None)
    ap.add_argument("--variants", action="store_true", help="compare candidate fill schemes")
    ap.add_argument("--packed", action="store_true", help="the packed fill against the plain")
    ap.add_argument("--host-memory", action="store_true", help="4 KiB, huge, cudaHostAlloc pages")
    args = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    if args.host_memory:
        rows = host_memory_rows(dev, args.reps)
        print(f"\nhost → GPU by kind of pinned memory ({torch.cuda.get_device_name(dev)})")
        print("| method | GB/s |\n|---|---|")
        for label, gbs in rows:
            print(f"| {label} | {gbs:.1f} |")
        if args.json:
            Path(args.json).write_text(json.dumps(dict(rows), indent=1))
        return
    if args.packed:
        rows = packed_rows(dev, args.reps)
        print(f"\npacked vs plain fill ({torch.cuda.get_device_name(dev)})")
        print("| method | link GB/s | bf16 GB/s delivered |\n|---|---|---|")
        for label, link, delivered in rows:
            print(f"| {label} | {link:.1f} | {delivered:.1f} |")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return
    if args.variants:
        rows = variant_rows(dev, args.reps)
        print(f"\nfill variants, host → GPU in CUDA graphs ({torch.cuda.get_device_name(dev)})")
        print(f"| {'method':<62} | GB/s  |\n|{'-' * 64}|-------|")
        for label, gbs in rows:
            print(f"| {label:<62} | {gbs:5.1f} |")
        if args.json:
            Path(args.json).write_text(json.dumps(dict(rows), indent=1))
        return
    E, H, inter = args.experts, args.hidden, args.inter
    host_set = {
        "w13": torch.randn(E, 2 * inter, H).to(torch.bfloat16),
        "w2": torch.randn(E, H, inter).to(torch.bfloat16),
    }
    store = HostExpertStore(dev)
    host = store.add_layer(host_set)  # pinned after fill, mapped
    expert_bytes = sum(t[0].numel() * t.element_size() for t in host.values())
    print(f"{E} experts of {expert_bytes / 1e6:.2f} MB pinned", flush=True)

    rows = fill_sweep(host, dev, args.reps)
    rows.append(("lookup + fill in a CUDA graph, all 8 miss", all_miss_graph(host, dev, 8, 20)))
    rows.append(("lookup + fill in a CUDA graph, all 1 miss", all_miss_graph(host, dev, 1, 20)))

    cache = SlotCache(host, 8, dev)
    for misses in (1, 8):

        def copy_engine(n=misses) -> None:
            for name, t in host.items():
                for m in range(n):
                    cache.slots[name][m].copy_(t[8 + m], non_blocking=True)

        sec = cuda_time(copy_engine, args.reps)
        rows.append((f"copy engine, {misses} experts", misses * expert_bytes / sec / 1e9))
    mach = [machinery(host, dev, args.reps, warps) for warps in (1, 2, 4)]
    store.close()

    gpu = torch.cuda.get_device_name(dev)
    print(f"\nhost → GPU, experts of {expert_bytes / 1e6:.2f} MB ({gpu})")
    print(f"| {'method':<52} | GB/s  |\n|{'-' * 54}|-------|")
    for label, gbs in rows:
        print(f"| {label:<52} | {gbs:5.1f} |")
    print("\nlookup + fill per MoE layer, 48 layers in one CUDA graph (45 slots, top-8, batch 1)")
    print("| lookup warps | all hits, us/layer | one miss a layer, us/layer |\n|---|---|---|")
    for warps, hit_us, miss_us in mach:
        print(f"| {warps} | {hit_us:.2f} | {miss_us:.1f} |")
    if args.json:
        out = {"bandwidth": dict(rows), "machinery": mach}
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
