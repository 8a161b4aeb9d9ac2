"""GGUF block kernels at Qwen3-30B-A3B's shapes on the GPU: the time of one call and the rate
at which it reads the stored bytes (decode is bound by them), against the bf16 kernels on
the same shapes. `--sweep` also times a few tile configs per kernel and prints the best, for
the tables in `kernels/gguf_tiles.py`. One run takes ~1 min (~4 with --sweep).

    python3 bench/bench_gguf_kernels.py [--types Q4_K,Q8_0] [--sweep] [--out bench/results/x.json]

`--types Q6_K` times the Q6_K word path (Q6K_WORDS) beside its byte path: MoE GEMVs (and a
Q4_K_M layer's Q4_K gate/up + Q6_K down), the linears and the LM head. `--types Q8_0` the
same for the Q8_0 word path (Q80_WORDS, off by default: its word tiles are the extra rows).

`--q4-k-m-qkv` times only a Q4_K_M layer's qkv (Q4_K q|k above Q6_K v, kept as segments:
`quant/gguf_segments.py`) at one and eight rows: the one segments launch, one launch a
segment (the per-segment route), and the bf16 linear the merge ran as before (dequantized).

`--words-sweep` times only the Q4_K word path's decode tiles (MoE gate/up and down at one and
eight tokens, the qkv and o_proj linears at one and eight rows with three split-K targets),
which were chosen by SASS instruction counts and never timed against each other (~2 min).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cuda_timing import cuda_graph_seconds  # noqa: E402

from xinfer import kernels  # noqa: E402
from xinfer.kernels import gemv_launch, moe_launch, reference  # noqa: E402
from xinfer.kernels import gguf_launch as gl  # noqa: E402
from xinfer.kernels import gguf_q8x_launch as q8x  # noqa: E402
from xinfer.kernels import gguf_segments_launch as gsl  # noqa: E402
from xinfer.kernels import gguf_tiles as gt  # noqa: E402
from xinfer.quant.gguf_blocks import BLOCK_TYPES  # noqa: E402

H, INTER, E, TOP_K = 2048, 768, 128, 8  # Qwen3-30B-A3B
LINEARS = {"qkv": (5120, 2048), "o_proj": (2048, 4096), "lm_head": (151936, 2048)}


def _time_us(fn, iters: int = 50) -> float:
    """Microseconds per call, replayed from a CUDA graph of one call."""
    return cuda_graph_seconds(fn, iters, calls_per_graph=1) * 1e6


# byte offsets of each type's float16 scales (kept small and finite in random blocks)
_F16_FIELDS = {"Q4_0": [0], "Q5_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def _raw(name: str, rows: int, k: int, experts: int | None = None) -> torch.Tensor:
    """Random valid blocks (rows, row bytes), or the same ones for every expert."""
    bt, rng = BLOCK_TYPES[name], np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(rows * k // bt.block_size, bt.type_size), dtype=np.uint8)
    for off in _F16_FIELDS[name]:
        scale = (rng.random(raw.shape[0]) * 1e-3 + 1e-4).astype(np.float16)
        raw[:, off : off + 2] = scale.view(np.uint8).reshape(-1, 2)
    t = torch.from_numpy(raw.reshape(rows, -1)).cuda()
    return t if experts is None else t.unsqueeze(0).expand(experts, -1, -1).contiguous()


def _moe_case(num_tokens: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(num_tokens, H, device="cuda", generator=g) * 0.05).bfloat16()
    logits = torch.randn(num_tokens, E, device="cuda", generator=g)
    weights, ids = reference.route_topk(logits, TOP_K, True)
    return x, ids, weights


# the block types with a word path (Q4K_WORDS, Q6K_WORDS, Q80_WORDS)
WORD_TYPES = ("Q4_K", "Q6_K", "Q8_0")


def _head_word_tiles(name: str) -> list:
    """The Q4_K / Q6_K / Q8_0 word path's four-row tiles for the LM head (rows x warps x super-blocks
    a step; none for other block types): whether the word tile beats the head's byte tile at
    one row and at eight (the same tile must serve every decode row count: a row's bits may
    not depend on the batch)."""
    if name == "Q4_K":
        shapes = [(8, 8, 1), (16, 8, 1), (16, 16, 1), (16, 16, 2), (32, 8, 1), (32, 16, 2)]
    elif name == "Q6_K":  # 32 rows: 255 registers (sm_90 SASS)
        shapes = [(8, 8, 1), (16, 8, 1), (16, 16, 2), (32, 8, 1)]
    elif name == "Q8_0":  # a "super-block" of the Q8_0 path: 256 columns (8 blocks)
        shapes = [(8, 8, 1), (16, 8, 1), (16, 16, 2), (32, 8, 1)]
    else:
        return []
    return [gt.GGUFTiles(4, bn, subs, warps, words=True) for bn, subs, warps in shapes]


def _q4_k_m_moe(num_tokens: int) -> list[dict]:
    """A Q4_K_M file's expert layer with Q6_K down (`ffn_down_exps` in half its layers):
    Q4_K gate/up, Q6_K down, the launcher's tiles (the down on Q6_K words where Q6K_WORDS)
    against its down on the byte path (the Q4_K byte tile, as before the Q6_K word path)."""
    b13, b2 = BLOCK_TYPES["Q4_K"], BLOCK_TYPES["Q6_K"]
    w13, w2 = _raw("Q4_K", 2 * INTER, H, E), _raw("Q6_K", H, INTER, E)
    expert_bytes = w13[0].numel() + w2[0].numel()
    x, ids, weights = _moe_case(num_tokens)
    distinct = len(set(ids.flatten().tolist()))
    t13 = gt.gemv_tiles(x.dtype, b13)
    byte_down = replace(t13, down=gt.gemv_tiles(x.dtype, b13, words=False))
    rows = []
    for label, tiles in (("default", None), ("Q6_K down bytes", byte_down)):
        us = _time_us(partial(gl.fused_moe, x, ids, weights, w13, b13, w2, b2, INTER, True,
                              tiles))  # fmt: skip
        rows.append(dict(kernel="moe_gemv Q4_K+Q6_K", type="Q4_K_M", tokens=num_tokens,
                         tiles=label, us=round(us, 1),
                         GBps=round(distinct * expert_bytes / us / 1e3, 1)))  # fmt: skip
    return rows


def bench_type(name: str, sweep: bool) -> list[dict]:
    bt = BLOCK_TYPES[name]
    rows = []
    w13, w2 = _raw(name, 2 * INTER, H, E), _raw(name, H, INTER, E)
    expert_bytes = w13[0].numel() + w2[0].numel()
    for num_tokens in (1, 8):
        x, ids, weights = _moe_case(num_tokens)
        pairs = num_tokens * TOP_K
        default = gt.gemv_tiles(x.dtype, bt)
        byte = gt.gemv_tiles(x.dtype, bt, words=False)
        # twice the sub-blocks a step: half the iterations, twice the loads in flight
        configs = [None, replace(byte, subs=2 * byte.subs)]
        if name in WORD_TYPES:  # the word path (Q4K_WORDS / ..) and the byte path
            configs.append(byte if default.words else gt.gemv_tiles(x.dtype, bt, words=True))
        if sweep:
            configs += [gt.GGUFTiles(1, bn, subs, warps) for bn in (4, 8, 16, 32)
                        for subs in (4, 8) for warps in (2, 4, 8)]  # fmt: skip
        for tiles in configs:
            us = _time_us(
                partial(gl.fused_moe, x, ids, weights, w13, bt, w2, bt, INTER, True, tiles)
            )
            distinct = len(set(ids.flatten().tolist()))
            rows.append(dict(kernel="moe_gemv", type=name, tokens=num_tokens,
                             tiles=str(tiles or default),
                             us=round(us, 1), GBps=round(distinct * expert_bytes / us / 1e3, 1),
                             pairs=pairs))  # fmt: skip
        if q8x.supports(bt, bt, w13, w2, INTER):  # int8 activations, dp4a (Q8X_MOE)
            us = _time_us(partial(q8x.fused_moe, x, ids, weights, w13, bt, w2, bt, INTER))
            rows.append(dict(kernel="moe_gemv_q8x", type=name, tokens=num_tokens, tiles="q8x",
                             us=round(us, 1), GBps=round(distinct * expert_bytes / us / 1e3, 1),
                             pairs=pairs))  # fmt: skip
        if name == "Q6_K":
            rows += _q4_k_m_moe(num_tokens)
    for label, (n, k) in LINEARS.items():
        w = _raw(name, n, k)
        x = torch.randn(1, k, device="cuda").bfloat16()
        configs = [None]
        if sweep:
            configs += [gt.GGUFTiles(16, bn, subs, warps) for bn in (16, 32, 64)
                        for subs in (4, 8) for warps in (4, 8)]  # fmt: skip
            # fewer warps a program, more programs an SM (the loop is latency-bound)
            configs += [gt.GGUFTiles(16, 16, subs, warps) for subs in (2, 4, 8)
                        for warps in (1, 2)]  # fmt: skip
            # the GEMV form (block_m 1: one x row a program, no tl.dot)
            configs += [gt.GGUFTiles(rows, bn, subs, warps) for rows in (1, 4)
                        for bn in (4, 8, 16) for subs in (4, 8) for warps in (2, 4)]  # fmt: skip
        else:  # the GEMV form and the 16-row dot tile, side by side
            configs += [
                gt.GGUFTiles(1, 8, 8, 4),
                gt.GGUFTiles(4, 8, 8, 4),
                gt.GGUFTiles(16, 16, 8, 4),
            ]
            if n >= gt.HEAD_ROWS:
                configs += [gt.GGUFTiles(1, 8, 8, 2), gt.GGUFTiles(1, 4, 8, 2)]
                configs += _head_word_tiles(name)
        default = gt.linear_tiles(1, x.dtype, bt, n)
        if name in WORD_TYPES:  # the word path (Q4K_WORDS / ..) and the byte path
            other = gt.linear_tiles(1, x.dtype, bt, n, words=not default.words)
            configs += [other] if other != default else []
        # the default tiles unsplit, then every tile with the default split-K target, then
        # the default tiles at 2 and 4 times that target (programs in flight vs the reduce)
        runs = [(replace(default, split_programs=0), "None unsplit")]
        runs += [(t or default, str(t)) for t in configs]
        if sweep:
            runs += [(replace(default, split_programs=p * gemv_launch.DECODE_PROGRAMS),
                      f"None programs x{p}") for p in (2, 4)]  # fmt: skip
        for tiles, label_tiles in runs:
            us = _time_us(partial(gl.linear, x, w, bt, None, n, k, tiles))
            splits = gt.decode_split(1, -(-n // tiles.block_n), k, tiles)[1]
            rows.append(dict(kernel=f"linear {label}", type=name, tokens=1, tiles=label_tiles,
                             splits=splits, us=round(us, 1),
                             GBps=round(w.numel() / us / 1e3, 1)))  # fmt: skip
        if q8x.supports_linear(bt, w, k):  # int8 activations, dp4a (Q8X_LINEAR)
            us = _time_us(partial(q8x.linear, x, w, bt, None, n))
            rows.append(dict(kernel=f"linear {label}", type=name, tokens=1, tiles="q8x",
                             us=round(us, 1), GBps=round(w.numel() / us / 1e3, 1)))  # fmt: skip
        # a decode batch of 8: the GEMV form decodes per row (four rows), the dot tile once
        # for 16 rows; the LM head's swept dot tile against its one-row and four-row GEMVs
        x8 = torch.randn(8, k, device="cuda").bfloat16()
        if label == "lm_head":
            tiles8 = (gt.GGUFTiles(16, 16, 2, 1), gt.GGUFTiles(1, 4, 8, 2),
                      gt.GGUFTiles(4, 4, 8, 2), *_head_word_tiles(name))  # fmt: skip
        else:
            tiles8 = (
                gt.GGUFTiles(1, 8, 8, 4),
                gt.GGUFTiles(4, 4, 8, 2),
                gt.GGUFTiles(4, 8, 8, 4),
                gt.GGUFTiles(16, 16, 8, 4),
            )
            if name in ("Q6_K", "Q8_0"):  # its word tile at eight rows too
                tiles8 += (gt.linear_tiles(8, x8.dtype, bt, n, words=True),)
        for tiles in tiles8:
            us = _time_us(partial(gl.linear, x8, w, bt, None, n, k, tiles))
            rows.append(dict(kernel=f"linear {label}", type=name, tokens=8,
                             tiles=str(tiles), us=round(us, 1)))  # fmt: skip
        if q8x.supports_linear(bt, w, k):
            us = _time_us(partial(q8x.linear, x8, w, bt, None, n))
            rows.append(dict(kernel=f"linear {label}", type=name, tokens=8, tiles="q8x",
                             us=round(us, 1)))  # fmt: skip
    x, ids, weights = _moe_case(2048)
    # the prefill path (dequantize, then the bf16 grouped GEMMs) and the in-register grouped
    # GEMMs at their default tile (and the sweep's)
    configs: list = ["dequant", None]
    if sweep:
        configs += [gt.GGUFTiles(bm, bn, subs, warps) for bm in (32, 64) for bn in (64, 128)
                    for subs in (2, 4) for warps in (4, 8)]  # fmt: skip
    for tiles in configs:
        dequant = tiles == "dequant"
        run = partial(gl.fused_moe, x, ids, weights, w13, bt, w2, bt, INTER, False,
                      None if dequant else tiles, dequant=dequant)  # fmt: skip
        us = _time_us(run, iters=10)
        flops = 2 * 2048 * TOP_K * 3 * H * INTER
        rows.append(dict(kernel="moe_grouped", type=name, tokens=2048, tiles=str(tiles),
                         us=round(us, 1), TFLOPs=round(flops / us / 1e6, 1)))  # fmt: skip
    for label, (n, k) in LINEARS.items():  # a 2048-token prefill chunk's linears, both paths
        if label == "lm_head":
            continue
        w = _raw(name, n, k)
        xp = (torch.randn(2048, k, device="cuda") * 0.05).bfloat16()
        for dequant in (True, False):
            us = _time_us(partial(gl.linear, xp, w, bt, None, n, k, dequant=dequant), iters=10)
            rows.append(dict(kernel=f"linear {label}", type=name, tokens=2048,
                             tiles="dequant" if dequant else "registers", us=round(us, 1),
                             TFLOPs=round(2 * 2048 * n * k / us / 1e6, 1)))  # fmt: skip
    return rows


_WORD_SHAPES = (
    (8, 1, 8),
    (16, 1, 8),
    (32, 1, 8),
    (8, 1, 16),
    (16, 1, 16),
    (32, 1, 16),
    (16, 2, 16),
    (32, 2, 16),
    (16, 2, 32),
    (16, 4, 32),
    (64, 1, 8),
)  # rows, warps, subs


def bench_q4k_words() -> list[dict]:
    """The Q4_K word tiles of the decode GEMVs, each timed alone: gate/up tiles with the
    default down tile, down tiles with the default gate/up tile, and the decode linears'
    four-row tiles at split-K targets None (the default), 0 (unsplit) and 2048 programs."""
    bt, rows = BLOCK_TYPES["Q4_K"], []
    w13, w2 = _raw("Q4_K", 2 * INTER, H, E), _raw("Q4_K", H, INTER, E)
    expert_bytes = w13[0].numel() + w2[0].numel()
    default = gt.gemv_tiles(torch.bfloat16, bt)
    tiles = [gt.GGUFTiles(1, bn, subs, warps, words=True) for bn, warps, subs in _WORD_SHAPES]
    cases = [("default", default)]
    cases += [(f"gate_up {t}", replace(t, down=default.down)) for t in tiles]
    cases += [(f"down {t}", replace(default, down=t)) for t in tiles]
    for num_tokens in (1, 8):
        x, ids, weights = _moe_case(num_tokens)
        distinct = len(set(ids.flatten().tolist()))
        for label, t in cases:
            try:
                us = _time_us(partial(gl.fused_moe, x, ids, weights, w13, bt, w2, bt, INTER,
                                      True, t))  # fmt: skip
            except Exception as e:  # a tile the kernel refuses or cannot compile
                print(f"skip {label}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            rows.append(dict(kernel=f"moe_gemv words {label.split()[0]}", type="Q4_K", tokens=num_tokens,
                             tiles=label, us=round(us, 1),
                             GBps=round(distinct * expert_bytes / us / 1e3, 1)))  # fmt: skip
    for label, (n, k) in LINEARS.items():
        if label == "lm_head":
            continue
        w = _raw("Q4_K", n, k)
        base = gt.linear_tiles(1, torch.bfloat16, bt, n)
        for m in (1, 8):
            x = torch.randn(m, k, device="cuda").bfloat16()
            for bn, warps, subs in _WORD_SHAPES:
                for programs in (None, 0, 2048):
                    t = gt.GGUFTiles(4, bn, subs, warps, words=True, split_programs=programs)
                    try:
                        us = _time_us(partial(gl.linear, x, w, bt, None, n, k, t))
                    except Exception as e:
                        print(f"skip {label} {t}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                        continue
                    splits = gt.decode_split(m, -(-n // bn), k, t)[1]
                    mark = " (default)" if t == base else ""
                    rows.append(dict(kernel=f"linear {label} words", type="Q4_K", tokens=m,
                                     tiles=f"{t}{mark}", splits=splits, us=round(us, 1),
                                     GBps=round(w.numel() / us / 1e3, 1)))  # fmt: skip
    return rows


def bench_q4_k_m_qkv() -> list[dict]:
    """A Q4_K_M layer's qkv (4608 Q4_K rows of q|k, 512 Q6_K rows of v, K = 2048) as the
    segments launch (`gguf_segments_launch`: one launch at decode), as one launch a segment
    (its fallback route), and as the bf16 linear of the dequantized merge."""
    n, k = LINEARS["qkv"]
    ws = [_raw("Q4_K", 4608, k), _raw("Q6_K", n - 4608, k)]
    btypes, seg_rows = [BLOCK_TYPES["Q4_K"], BLOCK_TYPES["Q6_K"]], [4608, n - 4608]
    stored = sum(w.numel() for w in ws)
    dense = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    rows = []
    for m in (1, 8):
        x = (torch.randn(m, k, device="cuda") * 0.05).bfloat16()
        one = gsl.segment_tiles(m, x.dtype, ws, btypes, seg_rows, k)
        calls = {
            "segments" + ("" if one else " (no one-launch tile)"): partial(
                gsl.linear, x, ws, btypes, seg_rows, None, k
            ),
            "per segment": partial(gsl.per_segment, x, ws, btypes, seg_rows, None, k),
            "bf16": partial(kernels.linear, x, dense),
        }
        for label, fn in calls.items():
            us = _time_us(fn)
            nbytes = dense.numel() * 2 if label == "bf16" else stored
            rows.append(dict(kernel="linear qkv Q4_K_M", type="Q4_K|Q6_K", tokens=m,
                             tiles=label, us=round(us, 1),
                             GBps=round(nbytes / us / 1e3, 1)))  # fmt: skip
    return rows


def bench_bf16() -> list[dict]:
    """The plain bf16 kernels on the same shapes (the engine's bf16 path), for scale."""
    w13 = torch.randn(E, 2 * INTER, H, device="cuda").bfloat16() * 0.02
    w2 = torch.randn(E, H, INTER, device="cuda").bfloat16() * 0.02
    rows = []
    for num_tokens in (1, 8, 2048):
        x, ids, weights = _moe_case(num_tokens)
        us = _time_us(partial(moe_launch.fused_moe, x, ids, weights, w13, w2), iters=10)
        distinct = len(set(ids.flatten().tolist()))
        rows.append(dict(kernel="moe bf16", type="BF16", tokens=num_tokens, us=round(us, 1),
                         GBps=round(distinct * 3 * H * INTER * 2 / us / 1e3, 1)))  # fmt: skip
    return rows


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--types", default="Q4_K,Q8_0,Q6_K,Q5_0")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--words-sweep", action="store_true", help="only the Q4_K word tiles")
    ap.add_argument("--q4-k-m-qkv", action="store_true", help="only a Q4_K_M layer's qkv")
    ap.add_argument("--out", default=None)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    if args.words_sweep:
        rows = bench_q4k_words()
    elif args.q4_k_m_qkv:
        rows = bench_q4_k_m_qkv()
    else:
        rows = bench_bf16()
        for name in args.types.split(","):
            rows += bench_type(name, args.sweep)
    best: dict[tuple, dict] = {}
    for r in rows:
        print(json.dumps(r), flush=True)
        key = (r["kernel"], r["type"], r["tokens"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    print("\nbest per (kernel, type, tokens):")
    for r in best.values():
        print(f"  {r['kernel']:16} {r['type']:5} T={r['tokens']:<5} {r['us']:>9} us  "
              f"{r.get('GBps', r.get('TFLOPs'))!s:>7}  {r.get('tiles', '')}")  # fmt: skip
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(json.dumps(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
