"""Sweep of the q8x GEMVs' launch constants (`kernels/gguf_q8x_launch.py`: warps a program,
rows a down / linear program) beside the float GEMVs, Qwen3-30B-A3B shapes, Q4_K, one H100
or H200, graph-timed: which configuration, if any, makes int8 activations pay.

    python3 bench/sweep_q8x.py"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]

import bench_gguf_kernels as bg  # noqa: E402

from xinfer.kernels import gguf_launch as gl  # noqa: E402
from xinfer.kernels import gguf_q8x_launch as q8x  # noqa: E402
from xinfer.quant.gguf_blocks import BLOCK_TYPES  # noqa: E402


def main() -> None:
    bt = BLOCK_TYPES["Q4_K"]
    w13, w2 = bg._raw("Q4_K", 2 * bg.INTER, bg.H, bg.E), bg._raw("Q4_K", bg.H, bg.INTER, bg.E)
    x, ids, weights = bg._moe_case(1)
    float_us = bg._time_us(partial(gl.fused_moe, x, ids, weights, w13, bt, w2, bt, bg.INTER, True))
    print(json.dumps({"kernel": "moe float", "us": round(float_us, 1)}), flush=True)
    w = bg._raw("Q4_K", 5120, 2048)
    x1 = bg.torch.randn(1, 2048, device="cuda").bfloat16()
    for warps in (1, 2, 4, 8):
        for bn in (8, 16, 32):
            q8x.NUM_WARPS, q8x.DOWN_BLOCK_N, q8x.LINEAR_BLOCK_N = warps, bn, bn
            moe = bg._time_us(partial(q8x.fused_moe, x, ids, weights, w13, bt, w2, bt, bg.INTER))
            lin = bg._time_us(partial(q8x.linear, x1, w, bt, None, 5120))
            row = {"warps": warps, "block_n": bn, "moe_q8x_us": round(moe, 1),
                   "qkv_q8x_us": round(lin, 1)}  # fmt: skip
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
