"""Decode speed of one engine under each setting of the kernel switches, in one process: the
engine is built once per format, and for each variant the switches are set and the CUDA graphs
captured again, then batch 1 and batch 8 timed; the variants run in rounds (A B C A B C) so
that drift shows as a spread, not as a difference.

    python3 bench/bench_decode_switches.py --formats bf16,gptq \
        --variants "router-apart;router;pdl,router-apart;pdl,merge,router" \
        --out bench/results/switches

Switches (module flags read at each launch, so a capture after setting them uses them):
`router` / `router-apart` router_launch.ENABLED (the router GEMV and its top-k in one launch,
or in two),
`pdl` pdl.ENABLED (programmatic dependent launch), `merge` attn_launch.FUSED_DECODE_REDUCE
(decode attention's merge in its last split), `tails-apart` the MoE combine and split-K
reduce as launches of their own, `qkv-gemv` the 5,120 x 2,048 qkv projection on the skinny
GEMM (its table says cuBLAS), `half2-off` quant_launch.HALF2_ZERO off (the int4 zero
subtracted per code in float32), `vec1` quant_launch.MOE_WORD_VEC 1 (the 4-bit MoE GEMV
loading one word a thread), `chunk-off` quant_launch.CHUNK_SUMS off (each group's sum
across the threads every step). `base` is the defaults. Formats as in bench_quant.py (dummy
weights, experts and attention quantized as the public checkpoints are). Writes NAME.json and
prints a table: median over rounds, and the spread."""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench_decode import time_engine_decode  # noqa: E402
from bench_quant import model_dir  # noqa: E402

from xinfer import LLM  # noqa: E402

# the Qwen3-30B-A3B qkv projection (5,120 x 2,048) on the skinny GEMM instead of cuBLAS
# (7.75 µs there against ~10 for the 2026-12-02 sweep's tiles, but cuBLAS cannot take PDL)
QKV_GEMV = [(16, None)]


def _flags():
    from xinfer.kernels import (
        attn_launch,
        gemv_launch,
        moe_launch,
        pdl,
        quant_launch,
        router_launch,
    )
    from xinfer.kernels.triton import routing

    qkv_tiles = gemv_launch.GemvConfig(block_n=32, block_k=128, num_stages=4, split_k=2)
    QKV_GEMV[0] = (16, qkv_tiles)
    return {
        "qkv-gemv": (gemv_launch._BY_SHAPE, (5120, 2048), list(QKV_GEMV)),
        "router": (router_launch, "ENABLED", True),
        "router-apart": (router_launch, "ENABLED", False),
        "pdl": (pdl, "ENABLED", True),
        "merge": (attn_launch, "FUSED_DECODE_REDUCE", True),
        "tails-apart": [(moe_launch, "FUSED_COMBINE", False),
                        (gemv_launch, "FUSED_SPLIT_REDUCE", False)],
        "half2-off": (quant_launch, "HALF2_ZERO", False),
        "vec1": (quant_launch, "MOE_WORD_VEC", 1),
        "chunk-off": (quant_launch, "CHUNK_SUMS", False),
        # the top-k's reductions inside one warp (both paths share it: their bits stay equal)
        "topk-1warp": (routing, "TOPK_WARPS", 1),
    }  # fmt: skip


def current_switches() -> dict:
    """{(module, flag name): value} of every switch now (the defaults, read at start)."""
    return {
        (id(target), name): (target, name, _get(target, name))
        for entry in _flags().values()
        for target, name, _ in (entry if isinstance(entry, list) else [entry])
    }


def _get(target, name):
    return target.get(name) if isinstance(target, dict) else getattr(target, name)


def _set(target, name, value) -> None:
    if isinstance(target, dict):
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value
    else:
        setattr(target, name, value)


def set_variant(variant: str, defaults: dict) -> None:
    """Every switch back to its default, then those `variant` names ("a,b") flipped."""
    for target, name, value in defaults.values():
        _set(target, name, value)
    flags = _flags()
    for part in filter(None, variant.split(",")):
        if part == "base":
            continue
        if part not in flags:
            raise SystemExit(f"unknown switch {part!r}; known: base, {', '.join(flags)}")
        entries = flags[part] if isinstance(flags[part], list) else [flags[part]]
        for target, name, value in entries:
            _set(target, name, value)


def recapture(llm: LLM) -> float:
    """Drop the engine's CUDA graphs and capture them again (seconds taken)."""
    from xinfer.runner.cuda_graph import CudaGraphRunner

    runner = llm.engine.runner
    runner.graph_runner = None
    gc.collect()
    torch.cuda.empty_cache()
    t = time.perf_counter()
    runner.graph_runner = CudaGraphRunner(runner)
    return time.perf_counter() - t


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bench/configs/qwen3_30b_a3b")
    ap.add_argument("--formats", default="bf16")
    ap.add_argument("--variants", default="router-apart;router;pdl,router-apart;pdl,merge,router")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--out", default="bench/results/switches")
    return ap


def _write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))


def main() -> None:
    args = build_parser().parse_args()
    variants = [v.strip() for v in args.variants.split(";") if v.strip()]
    batches = [int(b) for b in args.batches.split(",")]
    defaults = current_switches()
    for variant in variants:  # an unknown switch stops the run before any engine is built
        set_variant(variant, defaults)
    set_variant("base", defaults)
    result: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0),
        "model": args.model,
        "variants": variants,
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats.split(","):
            path = model_dir(Path(args.model), fmt, Path(tmp))
            set_variant("base", defaults)
            llm = LLM(str(path), device="cuda:0", dtype="bfloat16", load_format="dummy",
                      max_model_len=4096, num_kv_blocks=2048, max_num_seqs=max(batches),
                      dummy_weights_seed=0)  # fmt: skip
            times: dict[tuple[str, int], list[float]] = {}
            for r in range(args.rounds):
                for variant in variants:
                    set_variant(variant, defaults)
                    cap = recapture(llm)
                    for b in batches:
                        step = time_engine_decode(llm, b, 64, args.steps)
                        times.setdefault((variant, b), []).append(step)
                        print(f"{fmt} round {r} {variant:>16} b{b}: {b / step:7.1f} tok/s "
                              f"(capture {cap:.1f} s)", flush=True)  # fmt: skip
            set_variant("base", defaults)
            for (variant, b), steps in times.items():
                med = statistics.median(steps)
                result["rows"].append({
                    "format": fmt, "variant": variant, "batch": b, "step_ms": med * 1e3,
                    "tok_s": b / med, "steps_ms": [s * 1e3 for s in steps],
                })  # fmt: skip
            del llm
            gc.collect()
            torch.cuda.empty_cache()
            _write(result, Path(args.out))  # after each format: a cut-off run keeps the first
    print("\n| format | variant | batch | tok/s | step ms | spread ms |\n|---|---|---|---|---|---|")
    for row in result["rows"]:
        spread = max(row["steps_ms"]) - min(row["steps_ms"])
        print(f"| {row['format']} | {row['variant']} | {row['batch']} | {row['tok_s']:.1f} | "
              f"{row['step_ms']:.3f} | {spread:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
