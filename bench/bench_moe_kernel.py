"""Benchmark of the Triton fused-MoE kernels on the Qwen3-30B-A3B expert shape (bf16, random
weights and uniform-ish random routing): decode (T = 1, 8, 32, timed as CUDA-graph replay)
and prefill (T = 2048). Reports GB/s of touched expert bytes against the measured device copy
bandwidth, and TFLOP/s for prefill. Checks correctness against `reference.py` first. CUDA only.

    python bench/bench_moe_kernel.py                 # default table
    python bench/bench_moe_kernel.py --sweep         # also try other tile configs
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
from cuda_timing import cuda_seconds, device_copy_bandwidth  # noqa: E402

from xinfer.kernels import moe_launch as ml
from xinfer.kernels import reference

DEV = "cuda"
GRAPH_CALLS = 16  # distinct routings per graph, so L2 does not serve the next call's experts


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--decode", default="1,8,32", help="decode batch sizes (tokens)")
    p.add_argument("--prefill", default="2048", help="prefill sizes (tokens)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--sweep", action="store_true", help="time alternative tile configs too")
    return p.parse_args()


def make_batch(args, num_tokens: int, seed: int):
    g = torch.Generator(DEV).manual_seed(seed)
    hidden = torch.randn(num_tokens, args.hidden, generator=g, device=DEV).to(torch.bfloat16)
    logits = torch.randn(num_tokens, args.experts, generator=g, device=DEV)
    weights, ids = ml.route_topk(logits, args.top_k, renormalize=True)
    return hidden, ids, weights


def make_weights(args):
    g = torch.Generator(DEV).manual_seed(0)
    e, h, i = args.experts, args.hidden, args.inter
    w13 = (torch.randn(e, 2 * i, h, generator=g, device=DEV) / h**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=g, device=DEV) / i**0.5).to(torch.bfloat16)
    return w13, w2


def check_correctness(args, w13, w2, sizes: list[int]) -> None:
    for num_tokens in sizes:
        hidden, ids, weights = make_batch(args, num_tokens, seed=100 + num_tokens)
        out = ml.fused_moe(hidden, ids, weights, w13, w2).float()
        ref = reference.fused_moe(hidden, ids, weights, w13, w2).float()
        err = ((out - ref).abs().max() / ref.abs().max()).item()
        rel_norm = ((out - ref).norm() / ref.norm()).item()
        ok = err <= 2e-2 and rel_norm <= 1e-2
        verdict = "ok" if ok else "MISMATCH"
        line = f"check T={num_tokens:5d}: max err {err:.1e} x max|ref|, norm {rel_norm:.1e}"
        print(line, verdict)
        if not ok:
            sys.exit("fused_moe disagrees with the reference; not benchmarking")


def expert_bytes(args) -> int:
    return 3 * args.hidden * args.inter * 2  # w13 (2I, H) + w2 (H, I), bf16


def time_decode(args, w13, w2, num_tokens: int, **override) -> tuple[float, float]:
    """(seconds per call, touched expert bytes per call) from replaying GRAPH_CALLS calls."""
    batches = [make_batch(args, num_tokens, seed=s) for s in range(GRAPH_CALLS)]
    run = lambda: [ml.fused_moe(*b, w13, w2, **override) for b in batches]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    seconds = cuda_seconds(graph.replay, args.iters, warmup=False) / GRAPH_CALLS
    touched = sum(torch.unique(b[1]).numel() for b in batches) / GRAPH_CALLS
    return seconds, touched * expert_bytes(args)


def time_prefill(args, w13, w2, num_tokens: int, **override) -> tuple[float, float]:
    hidden, ids, weights = make_batch(args, num_tokens, seed=1)
    run = lambda: ml.fused_moe(hidden, ids, weights, w13, w2, **override)
    run()
    seconds = cuda_seconds(run, max(3, args.iters // 4), warmup=False)
    return seconds, torch.unique(ids).numel() * expert_bytes(args)


def sweep(args, w13, w2, decode: list[int], prefill: list[int]) -> None:
    for num_tokens in decode:
        if num_tokens * args.top_k > ml.MAX_GEMV_PAIRS:
            continue
        print(f"\nsweep GEMV, T={num_tokens} (block_n, block_k, down_block_n, warps): GB/s")
        for bn, bk, dn, nw in itertools.product((8, 16, 32), (128, 256, 512), (4, 8, 16), (4, 8)):
            cfg = ml.MoeConfig(block_n=bn, block_k=bk, num_warps=nw, down_block_n=dn)
            sec, nbytes = time_decode(args, w13, w2, num_tokens, config=cfg, use_gemv=True)
            print(f"  {bn:3d} {bk:4d} {dn:3d} {nw}: {nbytes / sec / 1e9:7.0f}")
    grouped = [  # (block_m, block_n, block_k, warps, stages, down_block_n)
        (16, 64, 128, 4, 4, 64), (16, 128, 128, 4, 3, 128), (32, 64, 128, 4, 4, 64),
        (64, 64, 64, 4, 3, 128), (64, 128, 64, 4, 3, 128), (64, 128, 64, 8, 3, 128),
        (128, 128, 64, 8, 3, 128), (64, 64, 128, 4, 3, 64), (128, 64, 64, 4, 4, 128),
        (128, 128, 64, 8, 4, 128), (64, 128, 128, 4, 3, 128), (128, 128, 128, 8, 3, 128),
        (64, 256, 64, 8, 3, 128),
    ]  # fmt: skip
    for num_tokens in [t for t in decode if t * args.top_k > ml.MAX_GEMV_PAIRS] + prefill:
        print(f"\nsweep grouped, T={num_tokens} (m, n, k, warps, stages, down_n): ms, TFLOP/s")
        hidden, ids, weights = make_batch(args, num_tokens, seed=1)
        ref = ml.fused_moe(hidden, ids, weights, w13, w2, use_gemv=False)
        flops = 6 * num_tokens * args.top_k * args.hidden * args.inter
        for bm, bn, bk, nw, ns, dn in grouped:
            cfg = ml.MoeConfig(bn, bk, nw, block_m=bm, num_stages=ns, down_block_n=dn)
            try:  # a config that does not compile or is wrong is reported, not timed
                got = ml.fused_moe(hidden, ids, weights, w13, w2, config=cfg, use_gemv=False)
                torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
            except Exception as e:
                print(f"  {bm:3d} {bn:3d} {bk:3d} {nw} {ns} {dn:3d}: failed: {e}"[:160])
                continue
            timer = time_prefill if num_tokens in prefill else time_decode
            sec, _ = timer(args, w13, w2, num_tokens, config=cfg, use_gemv=False)
            print(f"  {bm:3d} {bn:3d} {bk:3d} {nw} {ns} {dn:3d}: {sec * 1e3:8.3f} "
                  f"{flops / sec / 1e12:6.0f}")  # fmt: skip


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_moe_kernel.py needs a CUDA GPU")
    decode = [int(t) for t in args.decode.split(",") if t]
    prefill = [int(t) for t in args.prefill.split(",") if t]
    w13, w2 = make_weights(args)
    check_correctness(args, w13, w2, sorted({1, 8, 32, 300, *decode}))
    copy_bw = device_copy_bandwidth()
    rows = []
    for num_tokens in decode:
        sec, nbytes = time_decode(args, w13, w2, num_tokens)
        rows.append(("decode", num_tokens, sec, nbytes, 0.0))
    for num_tokens in prefill:
        sec, nbytes = time_prefill(args, w13, w2, num_tokens)
        flops = 6 * num_tokens * args.top_k * args.hidden * args.inter  # 2 * (2IH + HI) per pair
        rows.append(("prefill", num_tokens, sec, nbytes, flops / sec / 1e12))
    if args.sweep:
        sweep(args, w13, w2, decode, prefill)
    name = torch.cuda.get_device_name()
    print(f"\nfused_moe, {name}: E={args.experts} k={args.top_k} H={args.hidden} I={args.inter}")
    print(f"bf16, device copy bandwidth {copy_bw / 1e9:.0f} GB/s (read + write)")
    print(f"{'path':8s} {'T':>5s} {'us/call':>9s} experts {'GB/s':>7s} {'% copy':>6s} TFLOP/s")
    for path, num_tokens, sec, nbytes, tflops in rows:
        gbs = nbytes / sec / 1e9
        print(
            f"{path:8s} {num_tokens:5d} {sec * 1e6:9.1f} {nbytes / expert_bytes(args):7.1f} "
            f"{gbs:7.0f} {100 * gbs * 1e9 / copy_bw:5.0f}% {tflops:7.1f}"
        )


if __name__ == "__main__":
    main()
