"""The routing model's per-layer state walk over a prompt (`parametric_launch.advance_state`:
the two scan passes, `routing_scan_local_kernel` + `routing_scan_carry_kernel`), one
sequence of T tokens, Qwen3-30B-A3B's 128 experts, beside its twin's result; the time ×48
is what a 48-layer prompt pays. (The per-sequence walk it replaced, one program stepping
token by token, took 439 / 1,655 / 6,576 µs a layer at 2k / 8k / 32k tokens on the H200,
2026-12-04: docs/results/routing_state_2026-12-04_s4.txt.)

    python3 bench/bench_routing_state.py [--tokens 2048,8192,32768] [--experts 128]"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_timing import cuda_seconds  # noqa: E402

from xinfer.routing import parametric_launch  # noqa: E402
from xinfer.routing.config import PRESETS  # noqa: E402
from xinfer.routing.parametric import popularity_draw  # noqa: E402
from xinfer.routing.parametric_ops import (  # noqa: E402
    RoutingState,
    SequenceBatch,
    advance_state_reference,
    layer_constants,
)


def _setup(tokens: int, experts: int, device: str = "cuda"):
    dev = torch.device(device)
    p = PRESETS["qwen3-30b-a3b"]
    const = layer_constants(1, 9, p.layer_scale(9), p.sigma, p.tau, p.phi,
                            popularity_draw(1, 9, experts).to(dev))  # fmt: skip
    state = RoutingState.empty(4, experts, dev)
    batch = SequenceBatch(
        torch.tensor([0, tokens], dtype=torch.int32, device=dev),
        torch.tensor([tokens], dtype=torch.int32, device=dev),
        torch.tensor([0], dtype=torch.int64, device=dev),
        torch.tensor([5], dtype=torch.int64, device=dev),
        False,
    )
    return state, batch, const


def _measure(tokens: int, experts: int) -> dict:
    state, batch, const = _setup(tokens, experts)
    ref_state = RoutingState(state.c.cpu(), state.pos.cpu(), state.key.cpu())
    ref_batch = dataclasses.replace(
        batch,
        **{f: getattr(batch, f).cpu() for f in ("query_start_loc", "seq_lens", "rows", "keys")},
    )
    ref_const = dataclasses.replace(const, popularity=const.popularity.cpu())
    ref_c, _, _ = advance_state_reference(ref_state, ref_batch, ref_const, tokens)
    scan_c, _, _ = parametric_launch.advance_state(state, batch, const, tokens)
    t_scan = cuda_seconds(lambda: parametric_launch.advance_state(state, batch, const, tokens), 20)
    return {
        "tokens": tokens, "experts": experts,
        "scan_us": round(t_scan * 1e6, 1), "scan_48_layers_s": round(48 * t_scan, 4),
        "max_abs_diff_vs_twin": (scan_c.cpu() - ref_c).abs().max().item(),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="2048,8192,32768")
    ap.add_argument("--experts", type=int, default=128)
    args = ap.parse_args()
    for tokens in [int(t) for t in args.tokens.split(",")]:
        print(json.dumps(_measure(tokens, args.experts)), flush=True)


if __name__ == "__main__":
    main()
