"""Does the copy-engine fill (offload/copy_engine.py) work on this GPU, and how fast is it?

One call, stage by stage (each prints a line, so a failure names its stage): the driver and
NVRTC check; a graph of `--layers` fills, each from a Qwen3-30B-A3B-shaped host store (128
experts, w13 and w2 bf16, 9.44 MB an expert) with `m` misses a layer set directly in the
miss list; the result against the miss list (every missed row equals its host row, no other
row changes); then the replay time against the same fills by the SM-side kernel and against
plain copy-engine copies of the same bytes. Prints GB/s and µs per miss.

    python3 bench/probe_copy_engine_fill.py --misses 1,2,8 --layers 48
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_timing import cuda_seconds  # noqa: E402

from xinfer.host_memory import resident_bytes  # noqa: E402
from xinfer.offload import graph_nodes  # noqa: E402
from xinfer.offload import kernels as offload_kernels  # noqa: E402
from xinfer.offload.copy_engine import BounceBuffers, LayerCopies  # noqa: E402
from xinfer.offload.host_store import HostExpertStore  # noqa: E402
from xinfer.offload.slot_cache import SlotCache  # noqa: E402

T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def make_layers(args, device):
    store = HostExpertStore(device)
    hosts = []
    for _ in range(args.stores):
        shapes = {"w13": (2 * args.inter, args.hidden), "w2": (args.hidden, args.inter)}
        layer = {  # random bits made on the GPU (fast), kept in host RAM
            name: torch.randint(
                -30000, 30000, (args.experts, *shape), dtype=torch.int16, device=device
            ).cpu()
            for name, shape in shapes.items()
        }
        hosts.append(store.add_layer(layer))
    caches = [SlotCache(hosts[i % len(hosts)], args.slots, device) for i in range(args.layers)]
    return store, hosts, caches


def set_misses(caches, m: int, experts: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for c in caches:
        ids = torch.randperm(experts, generator=g)[:m].to(torch.int32)
        rows = torch.randperm(c.num_slots, generator=g)[:m].to(torch.int32)
        c.miss_ids.fill_(-1)
        c.miss_slots.fill_(-1)
        c.miss_ids[:m] = ids.to(c.device)
        c.miss_slots[:m] = rows.to(c.device)
        c.miss_count.fill_(m)


def check(caches, hosts, m: int, layers: int = 4) -> str:
    """Missed rows equal their host rows, on the first `layers` layers; other rows stay 0."""
    bad = 0
    for i, c in enumerate(caches[:layers]):
        host = hosts[i % len(hosts)]
        for e, r in zip(c.miss_ids[:m].tolist(), c.miss_slots[:m].tolist()):
            for name in host:
                if not torch.equal(c.slots[name][r].cpu(), host[name][e]):
                    bad += 1
        used = set(c.miss_slots[:m].tolist())
        for r in range(c.num_slots):
            if r not in used and any(bool(v[r].any()) for v in c.slots.values()):
                bad += 1
    return "ok" if bad == 0 else f"{bad} rows WRONG"


def _rss_gb() -> float:
    """Resident host memory of this process now (the graph's nodes live there)."""
    return (resident_bytes() or 0) / 1e9


def capture(fn) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--misses", default="1,2,8")
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--stores", type=int, default=2)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--slots", type=int, default=26)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--with-kernel", action="store_true", help="also time the SM fill kernel")
    p.add_argument("--ways", type=int, default=2, help="misses a WHILE pass moves (1-4)")
    args = p.parse_args()
    device = torch.device("cuda")
    torch.cuda.init()
    say(
        f"driver {graph_nodes.driver_version()}, torch {torch.__version__} cuda {torch.version.cuda}"
    )
    reason = graph_nodes.unavailable_reason()
    say(f"copy-engine fill available: {reason is None} {reason or ''}")
    if reason is not None:
        return
    store, hosts, caches = make_layers(args, device)
    expert_bytes = caches[0].expert_bytes
    say(
        f"{args.layers} layers, {expert_bytes / 1e6:.2f} MB an expert, host {store.nbytes / 1e9:.1f} GB pinned"
    )
    bounce = BounceBuffers(device, args.ways)
    copies = [LayerCopies(c, hosts[i % len(hosts)], bounce) for i, c in enumerate(caches)]
    torch.cuda.synchronize()
    t, rss, free = time.perf_counter(), _rss_gb(), torch.cuda.mem_get_info()[0]
    ce_graph = capture(lambda: [lc.fill() for lc in copies])
    torch.cuda.synchronize()
    say(
        f"copy-engine graph ({args.layers} layers x {2 * args.experts} bodies) captured and "
        f"instantiated in {time.perf_counter() - t:.2f} s, host memory "
        f"+{_rss_gb() - rss:.2f} GB, device memory +{(free - torch.cuda.mem_get_info()[0]) / 1e9:.2f} GB"
    )
    sm_graph = None
    if args.with_kernel:
        t = time.perf_counter()
        sm_graph = capture(
            lambda: [offload_kernels.fill(c, hosts[i % len(hosts)]) for i, c in enumerate(caches)]
        )
        say(f"fill-kernel graph captured in {time.perf_counter() - t:.2f} s")
    # Plain copy-engine copies of the same bytes (fixed addresses): the link's rate.
    src = hosts[0]["w13"]
    dst = torch.empty_like(src[:8], device=device)
    t_raw = cuda_seconds(lambda: dst.copy_(src[:8], non_blocking=True), args.iters)
    raw_gbs = dst.numel() * 2 / t_raw / 1e9
    say(f"plain copy-engine copy of 8 w13 rows: {raw_gbs:.1f} GB/s")

    for m in [int(x) for x in args.misses.split(",")]:
        for c in caches:
            for v in c.slots.values():
                v.zero_()
        set_misses(caches, m, args.experts, seed=m)
        ce_graph.replay()
        torch.cuda.synchronize()
        say(f"m={m}: copy-engine result {check(caches, hosts, m)}")
        nbytes = m * expert_bytes * args.layers
        t_ce = cuda_seconds(ce_graph.replay, args.iters)
        t_sm = cuda_seconds(sm_graph.replay, args.iters) if sm_graph else float("nan")
        say(
            f"m={m}: {nbytes / 1e9:.2f} GB a replay | copy engine {t_ce * 1e3:.2f} ms "
            f"{nbytes / t_ce / 1e9:.1f} GB/s | fill kernel {t_sm * 1e3:.2f} ms "
            f"{nbytes / t_sm / 1e9:.1f} GB/s | plain copies {raw_gbs:.1f} GB/s | "
            f"copy-engine µs a miss {t_ce / (m * args.layers) * 1e6:.0f}"
        )
    set_misses(caches, 0, args.experts, seed=0)
    t_sm = cuda_seconds(sm_graph.replay, args.iters) if sm_graph else float("nan")
    t_ce = cuda_seconds(ce_graph.replay, args.iters)
    say(f"m=0: copy engine {t_ce * 1e3:.3f} ms, fill kernel {t_sm * 1e3:.3f} ms a replay")
    store.close()


if __name__ == "__main__":
    main()
