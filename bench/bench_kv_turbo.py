"""Decode attention on each KV-cache dtype at long contexts, on one GPU: the Qwen3-30B-A3B
attention shape (32 query heads, 4 KV heads, head_dim 128, block 16, shuffled block
tables), batch 1 and 8, contexts 8k and 32k, bf16 / fp8 (e4m3) / turbo4 / turbo3 caches.
Each row times one layer's `kernels.paged_attention` call as CUDA-graph replay over enough
layers' caches that L2 does not serve the next call; a turbo call includes its q and output
rotations. `store` rows time one decode token's `kernels.qkv_prep` (norm-free RoPE + store;
for turbo: staging, the K|V rotation and the quantizing store). KV bytes read a call (codes
and scales as stored) and GB/s beside them.

`--variants` (turbo caches only; `;`-separated, each a `,`-joined set, `base` the defaults):
`shuffle` (the centroid lookup by warp shuffles: `attn_launch.TURBO_LOOKUP_SHUFFLE`),
`stagesN`, `splitN`, `blockN`, `warpsN` (`attn_launch.TURBO_DECODE_CONFIG`); each turbo row
is timed once per variant, checked first against the default variant's output.

    python3 bench/bench_kv_turbo.py [--batches 1,8] [--contexts 8192,32768] [--out r.json]
    python3 bench/bench_kv_turbo.py --kinds turbo4 --variants "base;shuffle;stages2;split64"
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from cuda_timing import calls_graph_seconds  # noqa: E402

from xinfer import kernels  # noqa: E402
from xinfer.kernels import attn_launch  # noqa: E402
from xinfer.kv import turbo  # noqa: E402
from xinfer.kv.format import TurboQuant  # noqa: E402

DEV = torch.device("cuda", 0)
HQ, HK, D, BLOCK = 32, 4, 128, 16
DTYPE = torch.bfloat16


def _cache(kind: str, num_blocks: int):
    """(k_cache, v_cache) for `kernels.paged_attention`: dense tensors, or (TurboKVCache, None)."""
    if kind.startswith("turbo"):
        cache = turbo.allocate(TurboQuant(int(kind[-1])), num_blocks, BLOCK, HK, D, DTYPE, DEV)
        k = torch.randn(num_blocks * BLOCK, HK, D, device=DEV, dtype=DTYPE)
        kernels.store_kv(k, torch.randn_like(k), cache, None, torch.arange(len(k), device=DEV))
        return cache, None
    shape = (num_blocks, BLOCK, HK, D)
    k = torch.randn(shape, device=DEV, dtype=DTYPE)
    v = torch.randn(shape, device=DEV, dtype=DTYPE)
    if kind == "fp8":
        k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    return k, v


def _kv_bytes(kind: str, tokens: int) -> int:
    row = {"bf16": 2 * D, "fp8": D}.get(kind) or (int(kind[-1]) * D // 8 + 2)
    return 2 * tokens * HK * row


_CONFIG_KEYS = {"stages": "num_stages", "split": "SPLIT_LEN", "block": "BLOCK_N",
                "warps": "num_warps"}  # fmt: skip


def set_variant(variant: str) -> None:
    """The turbo switches of `variant` (see the docstring); `base` leaves the defaults."""
    attn_launch.TURBO_LOOKUP_SHUFFLE = False
    attn_launch.TURBO_DECODE_CONFIG = None
    cfg = {}
    for part in (p.strip() for p in variant.split(",") if p.strip() and p.strip() != "base"):
        if part == "shuffle":
            attn_launch.TURBO_LOOKUP_SHUFFLE = True
            continue
        key = next((k for k in _CONFIG_KEYS if part.startswith(k) and part[len(k):].isdigit()),
                   None)  # fmt: skip
        if key is None:
            raise SystemExit(f"unknown variant part {part!r}")
        cfg[_CONFIG_KEYS[key]] = int(part[len(key) :])
    if cfg:
        base = dict(attn_launch.DECODE_CONFIGS[-1][1])  # the row of contexts from 8k on
        attn_launch.TURBO_DECODE_CONFIG = {**base, **cfg}


def decode_row(kind: str, batch: int, ctx: int, variant: str = "base") -> dict:
    blocks_per_seq = math.ceil(ctx / BLOCK)
    num_blocks = batch * blocks_per_seq
    nbytes = _kv_bytes(kind, batch * ctx)
    layers = max(2, min(24, math.ceil((1 << 30) / nbytes)))
    caches = [_cache(kind, num_blocks) for _ in range(layers)]
    tables = torch.randperm(num_blocks, device=DEV).view(batch, -1).to(torch.int32)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=DTYPE)
    lens = torch.full((batch,), ctx, device=DEV, dtype=torch.int32)
    qsl = torch.arange(batch + 1, device=DEV, dtype=torch.int32)
    scale = D**-0.5
    calls = [
        lambda k=k, v=v: kernels.paged_attention(q, k, v, tables, lens, qsl, scale, 1, ctx)
        for k, v in caches
    ]
    set_variant("base")
    want = calls[0]()
    set_variant(variant)
    got = calls[0]()
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    sec = calls_graph_seconds(calls, 20)
    set_variant("base")
    del caches, calls
    torch.cuda.empty_cache()
    return dict(kind=kind, what="decode", variant=variant, batch=batch, ctx=ctx, us=sec * 1e6,
                kv_mb=nbytes / 1e6, gbs=nbytes / sec / 1e9)  # fmt: skip


def store_row(kind: str, batch: int) -> dict:
    k_cache, v_cache = _cache(kind, 64)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=DTYPE)
    k = torch.randn(batch, HK, D, device=DEV, dtype=DTYPE)
    v = torch.randn_like(k)
    positions = torch.arange(batch, device=DEV) + 100
    cos_sin = torch.randn(4096, D, device=DEV)
    slots = torch.arange(batch, device=DEV) * 3
    sec = calls_graph_seconds(
        [lambda: kernels.qkv_prep(q, k, v, positions, cos_sin, k_cache, v_cache, slots)] * 8, 20
    )
    return dict(kind=kind, what="store", batch=batch, us=sec * 1e6)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="bf16,fp8,turbo4,turbo3")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--contexts", default="8192,32768")
    ap.add_argument("--variants", default="base")
    ap.add_argument("--out", default=None)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    variants = [v.strip() for v in args.variants.split(";") if v.strip()]
    for v in variants:  # a typo stops the run before anything is timed
        set_variant(v)
    set_variant("base")
    kinds = args.kinds.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for kind in kinds:
        for batch in batches:
            rows.append(store_row(kind, batch))
            for ctx in (int(c) for c in args.contexts.split(",")):
                for variant in variants if kind.startswith("turbo") else ["base"]:
                    rows.append(decode_row(kind, batch, ctx, variant))
                    print(rows[-1], flush=True)
    print("| cache | variant | batch | context | µs a layer | KV MB | GB/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r["what"] == "decode":
            print(f"| {r['kind']} | {r['variant']} | {r['batch']} | {r['ctx']} | "
                  f"{r['us']:.1f} | {r['kv_mb']:.1f} | {r['gbs']:.0f} |")  # fmt: skip
    print("| cache | batch | qkv prep + store µs |\n|---|---|---|")
    for r in rows:
        if r["what"] == "store":
            print(f"| {r['kind']} | {r['batch']} | {r['us']:.1f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(
            dict(device=torch.cuda.get_device_name(0), rows=rows), indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
