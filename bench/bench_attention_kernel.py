"""Benchmark of the Triton paged-attention kernels on the Qwen3-30B-A3B attention shape (32 query
heads, 4 KV heads, head_dim 128, bf16, block_size 16, shuffled block tables): decode at batch
1/8/32 and context 2k/8k, timed as CUDA-graph replay over several layers' caches (so L2 does
not serve the next call), and a 2k-token prefill (fresh, and chunked after 6k cached tokens).
Reports GB/s of KV read against the measured device copy bandwidth, TFLOP/s for prefill next
to torch SDPA on contiguous tensors. Checks correctness against `reference.py` first. CUDA only.

    python bench/bench_attention_kernel.py            # default table
    python bench/bench_attention_kernel.py --sweep    # also try other splits / tile configs
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from cuda_timing import cuda_seconds as timed  # noqa: E402
from cuda_timing import device_copy_bandwidth

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from xinfer.kernels import attn_launch as al  # noqa: E402
from xinfer.kernels import reference  # noqa: E402

DEV = "cuda"
DTYPE = torch.bfloat16


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--contexts", default="2048,8192")
    p.add_argument("--prefill", type=int, default=2048, help="new tokens in the prefill rows")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--sweep", action="store_true", help="time alternative splits/tiles too")
    return p.parse_args()


def graph_timed(calls: list, iters: int) -> float:
    """Mean seconds per call when `calls` are replayed back to back in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    return timed(graph.replay, iters) / len(calls)


def paged_case(a, seq_lens: list[int], query_lens: list[int], layers: int = 1):
    """q, [(k_cache, v_cache)] * layers, block tables (one shuffled table for all layers)."""
    bs = a.block_size
    blocks_per_seq = max(math.ceil(s / bs) for s in seq_lens)
    num_blocks = len(seq_lens) * blocks_per_seq
    shape = (num_blocks, bs, a.kv_heads, a.head_dim)
    caches = [
        (torch.randn(shape, device=DEV, dtype=DTYPE), torch.randn(shape, device=DEV, dtype=DTYPE))
        for _ in range(layers)
    ]
    tables = torch.randperm(num_blocks, device=DEV).view(len(seq_lens), -1).to(torch.int32)
    q = torch.randn(sum(query_lens), a.heads, a.head_dim, device=DEV, dtype=DTYPE)
    qsl = torch.tensor([0, *query_lens], device=DEV).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, device=DEV, dtype=torch.int32)
    return q, caches, tables, lens, qsl


def check_correctness(a) -> None:
    scale = a.head_dim**-0.5
    for seq_lens, query_lens in (
        ([1, 17, 1000, 2100, 0], [1] * 5),
        ([40, 1030, 2048], [1, 5, 2048]),
    ):
        q, [(k, v)], tables, lens, qsl = paged_case(a, [max(s, 1) for s in seq_lens], query_lens)
        lens.copy_(torch.tensor(seq_lens, device=DEV))
        ref = reference.paged_attention(q, k, v, tables, lens, qsl, scale)
        got = al.paged_attention(q, k, v, tables, lens, qsl, scale)
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
    print("correctness: decode and prefill match reference.py (atol = rtol = 2e-2)")


def bench_decode(a, batch: int, ctx: int, copy_bw: float, split_len=None, config=None) -> dict:
    kv_bytes = 2 * batch * ctx * a.kv_heads * a.head_dim * 2  # K and V, bf16
    layers = max(2, min(48, math.ceil((2 << 30) / kv_bytes)))  # >= 2 GiB of KV in the graph
    q, caches, tables, lens, qsl = paged_case(a, [ctx] * batch, [1] * batch, layers)
    scale = a.head_dim**-0.5
    calls = [
        lambda k=k, v=v: al.paged_attention(
            q, k, v, tables, lens, qsl, scale, 1, ctx, split_len=split_len, config=config
        )
        for k, v in caches
    ]
    sec = graph_timed(calls, a.iters)
    splits = al.decode_num_splits(ctx, split_len or al.SPLIT_TOKENS)
    del caches, calls
    return dict(
        batch=batch, ctx=ctx, splits=splits, us=sec * 1e6, mb=kv_bytes / 1e6,
        gbs=kv_bytes / sec / 1e9, pct=100 * kv_bytes / sec / copy_bw, cfg=config,
    )  # fmt: skip


def bench_prefill(a, new: int, ctx: int, config=None) -> dict:
    q, [(k, v)], tables, lens, qsl = paged_case(a, [ctx], [new])
    scale = a.head_dim**-0.5
    sec = timed(
        lambda: al.paged_attention(q, k, v, tables, lens, qsl, scale, config=config), a.iters
    )
    visible = sum(ctx - new + i + 1 for i in range(new))  # causal (query, key) pairs
    flops = 4 * a.heads * a.head_dim * visible
    sdpa_us = float("nan")
    if new == ctx:  # torch SDPA (flash) on contiguous tensors, same math
        qs = q.view(1, new, a.heads, a.head_dim).transpose(1, 2)
        ks = torch.randn(1, a.kv_heads, new, a.head_dim, device=DEV, dtype=DTYPE)
        fn = lambda: F.scaled_dot_product_attention(qs, ks, ks, is_causal=True, enable_gqa=True)
        sdpa_us = timed(fn, a.iters) * 1e6
    return dict(
        new=new, ctx=ctx, us=sec * 1e6, tflops=flops / sec / 1e12, sdpa_us=sdpa_us, cfg=config
    )


def sweep(a, copy_bw: float) -> None:
    print("\nsweep (decode: splits x config; prefill: tiles)")
    for batch, ctx in ((1, 8192), (8, 2048), (32, 8192)):
        for split_len in (128, 256, 512, 1024):
            for bn, warps in ((32, 4), (64, 4), (64, 8), (128, 8)):
                cfg = dict(BLOCK_N=bn, num_warps=warps, num_stages=2)
                r = bench_decode(a, batch, ctx, copy_bw, split_len, cfg)
                print(f"  decode B={batch:<3} ctx={ctx:<5} split_len={split_len:<4} {cfg}: "
                      f"{r['us']:8.1f} us  {r['gbs']:7.0f} GB/s")  # fmt: skip
    for bm, bn, warps, stages in ((128, 32, 8, 2), (128, 64, 8, 2), (64, 32, 4, 2),
                                  (64, 64, 4, 2), (128, 32, 8, 3), (128, 32, 4, 2)):  # fmt: skip
        cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
        r = bench_prefill(a, a.prefill, a.prefill, cfg)
        print(f"  prefill {a.prefill} {cfg}: {r['us']:8.1f} us  {r['tflops']:6.1f} TFLOP/s")


def main() -> None:
    a = parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_attention_kernel.py needs a CUDA GPU")
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    check_correctness(a)
    copy_bw = device_copy_bandwidth()
    batches = [int(b) for b in a.batches.split(",")]
    contexts = [int(c) for c in a.contexts.split(",")]
    decode = [bench_decode(a, b, c, copy_bw) for b in batches for c in contexts]
    prefill = [bench_prefill(a, a.prefill, a.prefill), bench_prefill(a, a.prefill, 4 * a.prefill)]
    if a.sweep:
        sweep(a, copy_bw)
    print(f"\ncopy bandwidth (read + write): {copy_bw / 1e12:.2f} TB/s")
    print(f"decode: Hq={a.heads} Hk={a.kv_heads} D={a.head_dim} bf16, CUDA graph, per layer call")
    print("| batch | context | splits | KV MB | us | KV GB/s | % of copy BW |")
    print("|---|---|---|---|---|---|---|")
    for r in decode:
        print(f"| {r['batch']} | {r['ctx']} | {r['splits']} | {r['mb']:.1f} | {r['us']:.1f} "
              f"| {r['gbs']:.0f} | {r['pct']:.0f}% |")  # fmt: skip
    print("\nprefill: eager, one sequence; SDPA on contiguous tensors (fresh prefill only)")
    print("| new tokens | context | us | TFLOP/s | torch SDPA us |")
    print("|---|---|---|---|---|")
    for r in prefill:
        print(
            f"| {r['new']} | {r['ctx']} | {r['us']:.0f} | {r['tflops']:.0f} | {r['sdpa_us']:.0f} |"
        )


if __name__ == "__main__":
    main()
