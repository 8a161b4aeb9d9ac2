"""One MoE layer under offload with a uniform random routing stream (the heavy-miss regime
that deep random-weight models never produce), beside its limit:

    limit per call = resident layer time + missed bytes / host→GPU bandwidth

    python3 bench/bench_offload_layer.py --fractions 0.1,0.2,0.35,0.5 [--steps 200]

Qwen3-30B-A3B expert shape by default (128 experts of 9.44 MB, top-8, batch 1). On CUDA each
call (lookup + fill + fused MoE) is captured in a CUDA graph and replayed, as in decode; the
resident layer is timed the same way. `--device cpu` runs the same code eagerly (a smoke
test: its times mean nothing)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from offload_bench.bandwidth import copy_engine_gbps  # noqa: E402

from xinfer.config import EngineConfig, OffloadConfig, SchedulerConfig  # noqa: E402
from xinfer.layers.moe import FusedMoE  # noqa: E402
from xinfer.offload.executor import ResidentExecutor  # noqa: E402
from xinfer.offload.setup import enable_offload  # noqa: E402


class OneLayer(nn.Module):
    """The smallest "model" `enable_offload` accepts: one FusedMoE with host experts."""

    def __init__(self, experts: int, top_k: int, hidden: int, inter: int) -> None:
        super().__init__()
        self.moe = FusedMoE(experts, top_k, hidden, inter, True, expert_device="cpu")

    def moe_layers(self) -> list[FusedMoE]:
        return [self.moe]


def routing_stream(steps: int, tokens: int, experts: int, top_k: int, device) -> torch.Tensor:
    """(steps, tokens, top_k) int32: each token's k distinct experts, uniformly at random."""
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(steps * tokens)])
    return ids.view(steps, tokens, top_k).to(torch.int32).to(device)


def timed_calls(call, ids_buf: torch.Tensor, stream: torch.Tensor, device) -> float:
    """Mean seconds per call over the stream (graph replay on CUDA, eager on the CPU)."""
    ids_buf.copy_(stream[0])
    call()  # compile / warm
    if device.type == "cuda":
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        run = graph.replay
        torch.cuda.synchronize()
    else:
        run = call
    t = time.perf_counter()
    for step in range(stream.shape[0]):
        ids_buf.copy_(stream[step])
        run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / stream.shape[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fractions", default="0.1,0.2,0.35,0.5")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    x = torch.randn(args.tokens, args.hidden, device=device, dtype=dtype)
    weights = torch.softmax(torch.randn(args.tokens, args.top_k, device=device), -1)
    ids_buf = torch.zeros(args.tokens, args.top_k, dtype=torch.int32, device=device)
    stream = routing_stream(args.steps, args.tokens, args.experts, args.top_k, device)
    expert_bytes = 3 * args.hidden * args.inter * torch.empty((), dtype=dtype).element_size()
    # pinned host → GPU through the copy engine, bytes/s (none on the CPU)
    bw = (
        copy_engine_gbps(device, expert_bytes, 8, 10) * 1e9
        if device.type == "cuda"
        else float("nan")
    )

    def make_layer() -> OneLayer:
        with torch.device("cpu"):
            model = OneLayer(args.experts, args.top_k, args.hidden, args.inter)
        gen = torch.Generator(device=device).manual_seed(0)  # same weights for every layer
        model.moe.expert_tensors = {  # plain tensors: `.to(dtype)` does not reach them
            name: torch.randn(t.shape, generator=gen, device=device).mul_(0.02).to(dtype).cpu()
            for name, t in model.moe.expert_tensors.items()
        }
        return model

    base = make_layer()
    resident = ResidentExecutor({k: v.to(device) for k, v in base.moe.expert_tensors.items()})
    t_res = timed_calls(lambda: resident(x, ids_buf, weights), ids_buf, stream, device)
    print(f"H2D {bw / 1e9:.1f} GB/s; resident layer {t_res * 1e6:.1f} us/call", flush=True)
    rows = []
    for frac in [float(f) for f in args.fractions.split(",")]:
        model = make_layer()
        cfg = EngineConfig(
            model="layer-bench", scheduler=SchedulerConfig(max_num_batched_tokens=16)
        )
        manager = enable_offload(model, cfg, OffloadConfig(fraction=frac), device)
        executor = model.moe.executor
        before = manager.stats()
        t_off = timed_calls(lambda ex=executor: ex(x, ids_buf, weights), ids_buf, stream, device)
        after = manager.stats()
        calls = args.steps + 1  # the warm-up call is counted too
        moved = (after["bytes_moved"] - before["bytes_moved"]) / calls
        hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
        limit = t_res + moved / bw
        rows.append((frac, manager.min_slots, hits / max(1, hits + misses), moved, t_off, limit))
        manager.close()
    print(
        "\n| GPU experts | slots | hit rate | MB moved/call | us/call | limit us | call / limit |"
    )
    print("|---|---|---|---|---|---|---|")
    for frac, slots, hit, moved, t_off, limit in rows:
        print(
            f"| {frac:g} | {slots} | {100 * hit:.1f}% | {moved / 1e6:.1f} | {t_off * 1e6:.1f} | "
            f"{limit * 1e6:.1f} | {t_off / limit:.2f} |"
        )


if __name__ == "__main__":
    main()
