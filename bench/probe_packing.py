"""Where does the start-up packing of `--moe-offload-compress` spend its time?

The engine's "offload" load phase packed the Qwen3.5-35B-A3B shape's 40 layers (64.4 GB of
bf16 experts) in 35.7 s on a healthy H100 host (2026-12-06), ~0.9 s a layer, where
registered copies and the GPU arithmetic predict ~0.2 s; 29.5-32.5 s once host pages were
faulted in when made. This probe packs `--layers` layers of one expert shape exactly as the
engine does (`offload/setup.py host_sets`: the next layer's plane buffers are made on a
helper thread while one packs), each layer's tensors in mappings of their own
(`xinfer/host_memory.py`, as the MoE layer allocates them) filled with N(0, 0.02) bf16. It
prints the seconds of each layer's fill (an expert at a time from the GPU, as the dummy
weights did before 2026-12-06) and packing, then the functions that took the time
(cProfile, cumulative, of the main thread: the helper's first touches run beside it and
show only as waits), so one run names the cost. `--no-prefault` leaves the mappings' pages
to their first writer (as before 2026-12-06: `xinfer/host_memory.py`), for the A/B. On CPU
it runs the same path unpinned.

    python3 bench/probe_packing.py --experts 256 --hidden 2048 --intermediate 512 --layers 3
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from xinfer import host_memory  # noqa: E402
from xinfer.host_memory import host_empty  # noqa: E402
from xinfer.offload.host_store import HostExpertStore  # noqa: E402
from xinfer.offload.packed import PackedExperts  # noqa: E402
from xinfer.offload.setup import host_sets  # noqa: E402


class _Layer:
    """What `host_sets` reads of a MoE layer: its expert tensors."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.expert_tensors = tensors


def make_layer(experts: int, hidden: int, inter: int, device: torch.device, seed: int) -> _Layer:
    """w13 (E, 2I, H) and w2 (E, H, I) bf16 on the host, drawn on `device` an expert at a
    time (as the dummy weights are) and copied into mappings of their own."""
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, row in (("w13_weight", (2 * inter, hidden)), ("w2_weight", (hidden, inter))):
        t = host_empty((experts, *row), torch.bfloat16)
        for e in range(experts):
            w = torch.empty(row, dtype=torch.bfloat16, device=device)
            t[e].copy_(w.normal_(0, 0.02, generator=gen))
        tensors[name] = t
    return _Layer(tensors)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--top", type=int, default=25, help="cProfile rows to print")
    ap.add_argument("--no-prefault", action="store_true", help="pages faulted by first writers")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    mapped = host_memory._mapped
    if args.no_prefault:
        host_memory._mapped = lambda shape, dtype, nbytes, prefault: mapped(
            shape, dtype, nbytes, False
        )
    try:
        return _run(args, device)
    finally:
        host_memory._mapped = mapped


def _run(args, device: torch.device) -> dict:
    store = HostExpertStore(device)
    layers = []
    for i in range(args.layers):
        start = time.perf_counter()
        layers.append(make_layer(args.experts, args.hidden, args.intermediate, device, seed=i))
        fill = time.perf_counter() - start
        gb = sum(t.nbytes for t in layers[-1].expert_tensors.values()) / 1e9
        print(f"fill: {fill:.3f} s ({gb / fill:.1f} GB/s)")
    print(f"{args.layers} layers of {gb:.2f} GB ({args.experts} experts) on {device}, "
          f"prefault {'off' if args.no_prefault else 'on'}")  # fmt: skip
    seconds, profile = [], cProfile.Profile()
    sets = host_sets(layers, True, device, store)
    for _ in layers:
        start = time.perf_counter()
        profile.enable()
        stored = next(sets)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        profile.disable()
        seconds.append(time.perf_counter() - start)
        packed = sum(isinstance(t, PackedExperts) for t in stored.values())
        print(f"layer: {seconds[-1]:.3f} s ({gb / seconds[-1]:.1f} GB/s), {packed} packed")
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(args.top)
    print(text.getvalue())
    store.close()
    return {"layer_gb": gb, "seconds": seconds}


if __name__ == "__main__":
    main()
