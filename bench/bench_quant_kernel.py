"""Quantized-format kernels on the Qwen3-30B-A3B shapes: GB/s of stored bytes per format for
the MoE decode GEMV (T = 1 and 8, top-8 of 128 experts), the decode linears (qkv, o_proj)
and the prefill paths, with the default tiles or a sweep over them. Past the decode sizes
(T = 32: a graphed decode batch beyond the GEMV; T = 2048: prefill) each case is timed on
both paths, `quant_prefill` (dequantize, then the bf16 kernels) and the in-register GEMMs,
to place the switch between them (`PREFILL_MIN_ROWS` / `PREFILL_MIN_PAIRS`, and each
format's `dequant_experts_in_prefill`). Decode-sized
calls are timed replayed from a CUDA graph (eager timings of them are launch cost).

    python3 bench/bench_quant_kernel.py --formats fp8,nvfp4,gptq --sweep
    python3 bench/bench_quant_kernel.py --formats fp8 --prefill-sweep   # T = 2048 tiles only
    python3 bench/bench_quant_kernel.py --decode-rows-sweep          # decode linears, 1 and 8 rows

Each timing is checked against the twin first. A sweep prints the best tiles per case; put
them in `kernels/quant_launch.py` (decode tiles must stay shape-only: batch invariance)."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cuda_timing import cuda_graph_seconds, cuda_seconds  # noqa: E402

from xinfer.kernels import gemv_launch, moe_launch, reference  # noqa: E402
from xinfer.kernels import quant_launch as ql  # noqa: E402
from xinfer.kernels.quant_groups import packed  # noqa: E402
from xinfer.quant.awq import AwqInt4  # noqa: E402
from xinfer.quant.compressed_tensors import PackQuantizedInt4  # noqa: E402
from xinfer.quant.fp8 import Fp8Block  # noqa: E402
from xinfer.quant.gptq import GptqInt4  # noqa: E402
from xinfer.quant.nvfp4 import Nvfp4  # noqa: E402
from xinfer.quant.unquantized import Unquantized  # noqa: E402

DEV = torch.device("cuda", 0)
FORMATS = {
    "bf16": Unquantized(torch.bfloat16),
    "fp8": Fp8Block(128, 128),
    "nvfp4": Nvfp4(),
    "gptq": GptqInt4(group_size=128, has_zero=False),
    "awq": AwqInt4(group_size=128, has_zero=True),
    "ct": PackQuantizedInt4(128, False, torch.bfloat16),
}
HIDDEN, INTER, NUM_EXPERTS, TOP_K = 2048, 768, 128, 8


def stack(fmt, n, k, count, g):
    parts = [fmt.dummy(n, k, g, 0.02) for _ in range(count)]
    return {name: torch.stack([p[name] for p in parts]) for name in parts[0]}


def nbytes(tensors: dict, rows: int | None = None) -> int:
    per = sum(t[0].numel() * t.element_size() for t in tensors.values())
    return per * (rows if rows is not None else 1)


PREFILL_SWEEP = [  # the in-register grouped GEMMs' tiles at prefill sizes
    ql.QuantTiles(bm, bn, bk, nw, num_stages=st)
    for bm, bn, bk, nw, st in itertools.product((64, 128), (64, 128), (64, 128), (4, 8), (3, 4))
]


def prefill_sweep(name, run, ref, tokens) -> None:
    """Time the in-register prefill path (`dequant=False`) over PREFILL_SWEEP; each tile is
    checked against the twin first. The default tiles' time is printed by the caller."""
    timed = []
    for cfg in PREFILL_SWEEP:
        try:
            err = (run(tiles=cfg, dequant=False).float() - ref).norm() / ref.norm()
            assert err < 1e-2, f"{name} moe T={tokens} {cfg}: relative error {err:.2e}"
            sec = cuda_seconds(lambda cfg=cfg: run(tiles=cfg, dequant=False), 20)
        except Exception as e:  # a tile the compiler refuses (registers, shared memory)
            print(f"  in registers {cfg}: {type(e).__name__}")
            continue
        timed.append((sec, cfg))
    for sec, cfg in sorted(timed, key=lambda t: t[0])[:6]:
        print(f"  in registers {cfg}: {sec * 1e6:7.1f} us")


def moe_case(name, fmt, tokens, sweep, sweep_prefill=False):
    g = torch.Generator(device=DEV).manual_seed(0)
    w13, w2 = (
        stack(fmt, 2 * INTER, HIDDEN, NUM_EXPERTS, g),
        stack(fmt, HIDDEN, INTER, NUM_EXPERTS, g),
    )
    hidden = torch.randn(tokens, HIDDEN, device=DEV, dtype=torch.bfloat16)
    weights, ids = reference.route_topk(torch.randn(tokens, NUM_EXPERTS, device=DEV), TOP_K, True)
    touched = len(set(ids.flatten().tolist()))
    moved = touched * (nbytes(w13) + nbytes(w2))
    if name == "bf16":
        run = lambda **kw: moe_launch.fused_moe(hidden, ids, weights, w13["weight"], w2["weight"])
        sweep = False
    else:
        run = lambda **kw: ql.fused_moe(hidden, ids, weights, fmt, w13, w2, INTER, **kw)
        ref = fmt.reference_moe(hidden, ids, weights, w13, w2, INTER).float()
        err = (run().float() - ref).norm() / ref.norm()
        assert err < 1e-2, f"{name} moe T={tokens}: relative error {err:.2e}"
    configs = [None]
    if sweep:  # columns a step: 1, 2 and 4 times the default (~2 KB of bytes a row tile)
        # (down rows 32 and 64: fewer down programs, each paying its setup and reduction
        # once for more rows; the format's loop form, joined or not, kept)
        base = ql.gemv_tiles(fmt, fmt.kernel_weights(w13, HIDDEN))
        d = base.block_k
        configs += [dataclasses.replace(base, block_n=bn, block_k=bk, num_warps=nw,
                                        down_block_n=dn) for bn, bk, nw, dn in
                    itertools.product((4, 8, 16), (d, 2 * d, 4 * d), (4, 8), (16, 32, 64))]  # fmt: skip
    timer = graph_timer(tokens <= 64)  # decode batches run in graphs
    best = None
    timed = []
    for cfg in configs:
        try:
            sec = timer(lambda cfg=cfg: run(tiles=cfg) if cfg else run(), 50)
        except Exception as e:  # a tile the compiler refuses (registers, shared memory)
            print(f"  {cfg}: {type(e).__name__}")
            continue
        timed.append((sec, cfg))
        if best is None or sec < best[0]:
            best = (sec, cfg)
        if cfg is None:
            print(f"{name:6s} moe T={tokens}: {sec * 1e6:7.1f} us, "
                  f"{moved / sec / 1e12:.2f} TB/s of stored bytes ({touched} experts)")  # fmt: skip
    if name != "bf16" and tokens * TOP_K > moe_launch.MAX_GEMV_PAIRS:
        for dequant, what in ((True, "dequantized (quant_prefill)"), (False, "in registers")):
            err = (run(dequant=dequant).float() - ref).norm() / ref.norm()
            assert err < 1e-2, f"{name} moe T={tokens} {what}: relative error {err:.2e}"
            sec = timer(lambda d=dequant: run(dequant=d), 50)
            print(f"  {what}: {sec * 1e6:7.1f} us")
        if sweep_prefill:
            prefill_sweep(name, run, ref, tokens)
    if sweep and best and best[1] is not None:
        print(f"  best {best[1]}: {best[0] * 1e6:.1f} us, {moved / best[0] / 1e12:.2f} TB/s")
    for sec, cfg in sorted(timed, key=lambda t: t[0])[1:5] if sweep else ():
        print(f"  next {cfg}: {sec * 1e6:.1f} us")
    if name != "bf16" and tokens * TOP_K <= moe_launch.MAX_GEMV_PAIRS:
        # the GEMV scaling each group's sum instead of each weight (quant_launch.FACTORED)
        best_tiles = best[1] if sweep and best and best[1] else None
        base = best_tiles or ql.gemv_tiles(fmt, fmt.kernel_weights(w13, HIDDEN))
        variants = [dataclasses.replace(base, factored=f) for f in (False, True)]
        if not sweep:  # more columns a step: more bytes in flight a program
            variants += [dataclasses.replace(base, block_k=base.block_k * t) for t in (2, 4)]
        # the other loop form: gate and up in one loop (half the dependent iterations) where
        # the default reads them one after the other, and the reverse
        variants.append(dataclasses.replace(base, joined=not base.joined))
        for cfg in variants:
            err = (run(tiles=cfg).float() - ref).norm() / ref.norm()
            assert err < 1e-2, f"{name} moe T={tokens} {cfg}: error {err:.2e}"
            sec = timer(lambda cfg=cfg: run(tiles=cfg), 50)
            print(f"  {cfg}: {sec * 1e6:.1f} us, {moved / sec / 1e12:.2f} TB/s")


def graph_timer(decode: bool):
    """Decode-sized calls are timed replayed from a CUDA graph, as decode runs them (eager
    timings of microsecond kernels are mostly Python launch cost); larger ones eagerly."""
    return cuda_graph_seconds if decode else cuda_seconds


def linear_case(name, fmt, n, k, m, sweep):
    g = torch.Generator(device=DEV).manual_seed(1)
    t = fmt.dummy(n, k, g, 0.02)
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    moved = sum(v.numel() * v.element_size() for v in t.values())
    if name == "bf16":
        from xinfer import kernels

        run = lambda **kw: kernels.linear(x, t["weight"])
        sweep = False
    else:
        run = lambda **kw: ql.linear(x, fmt, t, None, n, k, **kw)
        ref = fmt.reference_linear(x, t, None, n, k).float()
        err = (run().float() - ref).norm() / ref.norm()
        assert err < 1e-2, f"{name} linear {m}x{n}x{k}: relative error {err:.2e}"
    configs = [None]
    decode = name != "bf16" and m <= ql.DECODE_M
    gemv_k = 512 if name != "bf16" and packed(fmt.kernel_weights(t, k)) else 256
    if sweep and decode:  # the GEMV form (block_m 1: one x row a program, no tl.dot)
        configs += [ql.QuantTiles(rows, bn, bk, nw) for rows, bn, bk, nw in
                    itertools.product((1, 4), (4, 8, 16), (gemv_k, 2 * gemv_k, 4 * gemv_k),
                                      (4, 8))]  # fmt: skip
        configs.append(ql.QuantTiles(16, 32, gemv_k // 2, 4))  # the dot tile
    elif sweep:
        configs += [ql.QuantTiles(64, bn, bk, nw) for bn, bk, nw in
                    itertools.product((16, 32, 64, 128), (64, 128, 256, 512), (4, 8))]  # fmt: skip
    elif decode:  # the GEMV form and the 16-row dot tile side by side, each printed
        # (bytes in flight: a program's loads of one step are ~8 B a thread at the default
        # tile; 2-4x the columns a step put 16-32 B a thread in flight)
        configs += [
            ql.QuantTiles(1, 8, gemv_k, 8),  # one row a program
            ql.QuantTiles(4, 8, 2 * gemv_k, 8),  # four rows a program (the default: 4, 8, d)
            ql.QuantTiles(4, 4, gemv_k, 4),
            ql.QuantTiles(1, 8, 2 * gemv_k, 8),
            ql.QuantTiles(1, 8, 4 * gemv_k, 8),
            ql.QuantTiles(16, 32, gemv_k // 2, 4),  # the dot tile
        ]
        for cfg in configs[1:]:
            err = (run(tiles=cfg).float() - ref).norm() / ref.norm()
            assert err < 1e-2, f"{name} linear {cfg}: relative error {err:.2e}"
    timer = graph_timer(m <= 64)
    best = None
    timed = []
    for cfg in configs:
        try:
            sec = timer(lambda cfg=cfg: run(tiles=cfg) if cfg else run(), 50)
        except Exception as e:
            print(f"  {cfg}: {type(e).__name__}")
            continue
        timed.append((sec, cfg))
        if best is None or sec < best[0]:
            best = (sec, cfg)
        if cfg is None:
            print(f"{name:6s} linear {m}x{n}x{k}: {sec * 1e6:7.1f} us, "
                  f"{moved / sec / 1e12:.2f} TB/s of stored weight bytes")  # fmt: skip
        elif decode and not sweep:
            print(f"  {cfg}: {sec * 1e6:7.1f} us")
    if name != "bf16" and m > ql.DECODE_M:
        for dequant, what in ((True, "dequantized (quant_prefill)"), (False, "in registers")):
            sec = timer(lambda d=dequant: run(dequant=d), 50)
            print(f"  {what}: {sec * 1e6:7.1f} us")
    if sweep and best and best[1] is not None:
        print(f"  best {best[1]}: {best[0] * 1e6:.1f} us")
    for sec, cfg in sorted(timed, key=lambda t: t[0])[1:5] if sweep else ():
        print(f"  next {cfg}: {sec * 1e6:.1f} us")
    if sweep and name != "bf16" and m <= ql.DECODE_M:  # more K splits at the default tiles
        default = ql.linear_tiles(m, x.dtype, fmt.kernel_weights(t, k), k, fmt)
        for times in (2, 4):
            programs = times * gemv_launch.DECODE_PROGRAMS
            cfg = dataclasses.replace(default, split_programs=programs)
            sec = timer(lambda cfg=cfg: run(tiles=cfg), 50)
            print(f"  split-K program target {programs}: {sec * 1e6:7.1f} us")


def decode_rows_sweep(name, fmt, n, k) -> None:
    """The decode linear's GEMV-form tiles at one row (the one-row kernel) and at eight (the
    four-row kernel, two programs along M), side by side: wider BLOCK_N gives a thread several
    output rows of the same columns, so x is loaded and converted once for them (sm_90 SASS,
    FP8 at 8 rows: 0.688 warp instructions a weight a program at 8 x 256 of 8 warps, 0.364 at
    32 x 256 of 4). A tile serves decode only if one row alone gets the bits it gets among
    eight (batch invariance): each candidate is checked for that on every row first (the
    rows that differ are listed: a row's place in its four-row program shows), and the
    eight-row call twice (run-to-run determinism). One row on the four-row kernel (the 4-bit
    formats' default) is timed and checked too, as built for four rows and with rows 1-3
    compiled out (`quant_launch.ONE_ROW_PRUNED`)."""
    g = torch.Generator(device=DEV).manual_seed(1)
    t = fmt.dummy(n, k, g, 0.02)
    x8 = torch.randn(8, k, device=DEV, dtype=torch.bfloat16)
    ref = fmt.reference_linear(x8, t, None, n, k).float()
    kw = fmt.kernel_weights(t, k)
    d = ql.linear_tiles(1, torch.bfloat16, kw, k).block_k  # the format-blind default's
    timer = graph_timer(True)
    default = [ql.linear_tiles(m, torch.bfloat16, kw, k, fmt) for m in (1, 8)]
    print(f"{name:6s} linear {n}x{k}, default {default[1]}")

    def alone_differ(tiles, out8) -> list[int]:  # the rows whose call alone differs from out8
        return [j for j in range(8) if not torch.equal(
            ql.linear(x8[j : j + 1], fmt, t, None, n, k, tiles=tiles), out8[j : j + 1])]  # fmt: skip

    def us(tiles, rows: int) -> float:
        return timer(lambda: ql.linear(x8[:rows], fmt, t, None, n, k, tiles=tiles), 50) * 1e6

    rows = []
    candidates = [*itertools.product((8, 16, 32), (d,), (4, 8)), (16, 2 * d, 4), (32, 2 * d, 4)]
    # K in one or two steps (a program's loads all in flight at once: the loop's loads are
    # not pipelined, so each step waits for its own)
    candidates += [(8, 4 * d, 4), (16, 4 * d, 8), (16, 8 * d, 8)]
    for bn, bk, nw in candidates:
        one, four = ql.QuantTiles(1, bn, bk, nw), ql.QuantTiles(4, bn, bk, nw)
        try:
            out8 = ql.linear(x8, fmt, t, None, n, k, tiles=four)
            err = (out8.float() - ref).norm() / ref.norm()
            assert err < 1e-2, f"{name} {four}: relative error {err:.2e}"
            differ = alone_differ(one, out8)
            again = torch.equal(ql.linear(x8, fmt, t, None, n, k, tiles=four), out8)
            us1, us8 = us(one, 1), us(four, 8)
            # one row on the four-row kernel, as built for four rows and with rows 1-3
            # compiled out (ONE_ROW_PRUNED): bits against the eight-row call, and time
            alone4 = []
            for pruned in (False, True):
                ql.ONE_ROW_PRUNED = pruned
                alone4.append((us(four, 1), not alone_differ(four, out8)))
        except Exception as e:  # a tile the compiler refuses (registers, shared memory)
            print(f"  {bn} x {bk}, {nw} warps: {type(e).__name__}: {str(e)[:160]}")
            continue
        finally:
            ql.ONE_ROW_PRUNED = False
        rows.append((us1 + us8, bn, bk, nw, us1, us8, differ, again, alone4))
    for _, bn, bk, nw, us1, us8, differ, again, alone4 in sorted(rows):
        mark = f"  (rows {differ} alone differ: not batch-invariant)" if differ else ""
        mark += "" if again else "  (eight rows twice differ: not deterministic)"
        dflt = " (default)" if (bn, bk, nw) == (default[1].block_n, default[1].block_k,
                                                  default[1].num_warps) else ""  # fmt: skip
        four_row = ", ".join(
            f"{what} {t_us:.1f} us{'' if same else ' (differs)'}"
            for what, (t_us, same) in zip(("four-row", "pruned"), alone4)
        )
        print(
            f"  {bn:2d} x {bk:4d}, {nw} warps: 1 row {us1:6.1f} us, 8 rows {us8:6.1f} us{dflt}{mark}"
            f"; 1 row on the four-row kernel: {four_row}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="bf16,fp8,nvfp4,gptq,awq,ct")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument(
        "--prefill-sweep", action="store_true",
        help="only the 2,048-token MoE, its in-register tiles swept (PREFILL_SWEEP)",
    )  # fmt: skip
    ap.add_argument(
        "--decode-rows-sweep", action="store_true",
        help="only the decode linears (qkv, o_proj): GEMV-form tiles at 1 and 8 rows",
    )  # fmt: skip
    args = ap.parse_args()
    if args.decode_rows_sweep:
        for name in args.formats.split(","):
            for n, k in ((5120, 2048), (2048, 4096)):
                decode_rows_sweep(name, FORMATS[name], n, k)
        return
    if args.prefill_sweep:
        for name in args.formats.split(","):
            moe_case(name, FORMATS[name], 2048, False, sweep_prefill=name != "bf16")
        return
    for name in args.formats.split(","):
        fmt = FORMATS[name]
        for tokens in (1, 8):  # the sweep at one token (the batch-1 decode)
            moe_case(name, fmt, tokens, args.sweep and tokens == 1)
        for tokens in (32, 2048):  # graphed decode past the GEMV; prefill
            moe_case(name, fmt, tokens, False)
        for n, k in ((5120, 2048), (2048, 4096)):
            linear_case(name, fmt, n, k, 1, args.sweep)
        for m in (8, 32, 2048):  # a decode batch of 8 (GEMV vs dot), then past the decode tile
            linear_case(name, fmt, 5120, 2048, m, False)


if __name__ == "__main__":
    main()
