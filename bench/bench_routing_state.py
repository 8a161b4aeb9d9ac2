"""The routing model's per-layer state walk over a prompt: the per-sequence kernel (one
program stepping token by token, what prefill used until 2026-12-04) against the two scan
passes (`routing_scan_local_kernel` + `routing_scan_carry_kernel`). One sequence of T
tokens, Qwen3-30B-A3B's 128 experts; the time ×48 is what a 48-layer prompt pays.

    python3 bench/bench_routing_state.py [--tokens 2048,8192,32768] [--experts 128]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_timing import cuda_seconds  # noqa: E402

from xinfer.kernels.triton import routing_model as jit  # noqa: E402
from xinfer.routing import parametric_launch  # noqa: E402
from xinfer.routing.config import PRESETS  # noqa: E402
from xinfer.routing.parametric import popularity_draw  # noqa: E402
from xinfer.routing.parametric_ops import RoutingState, SequenceBatch, layer_constants  # noqa: E402


def _setup(tokens: int, experts: int):
    dev = torch.device("cuda")
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


def _sequential(state, batch, const, tokens: int, experts: int):
    c = torch.empty(tokens, experts, dtype=torch.float32, device=state.c.device)
    key = torch.empty(tokens, dtype=torch.int64, device=state.c.device)
    pos = torch.empty_like(key)
    jit.routing_state_kernel[(1,)](
        batch.query_start_loc, batch.seq_lens, batch.rows, batch.keys,
        state.c, state.pos, state.key, c, key, pos,
        experts, state.scratch_row, const.step_base, const.init_base, const.phi, const.innovation,
        BLOCK_E=triton.next_power_of_2(experts), num_warps=2,
    )  # fmt: skip
    return c


def _measure(tokens: int, experts: int) -> dict:
    state, batch, const = _setup(tokens, experts)

    def fresh() -> RoutingState:
        return RoutingState(state.c.clone(), state.pos.clone(), state.key.clone())

    seq_c = _sequential(fresh(), batch, const, tokens, experts)
    scan_c, _, _ = parametric_launch.advance_state(fresh(), batch, const, tokens)
    t_seq = cuda_seconds(lambda: _sequential(state, batch, const, tokens, experts), 3)
    t_scan = cuda_seconds(lambda: parametric_launch.advance_state(state, batch, const, tokens), 20)
    return {
        "tokens": tokens, "experts": experts,
        "sequential_us": round(t_seq * 1e6, 1), "scan_us": round(t_scan * 1e6, 1),
        "sequential_48_layers_s": round(48 * t_seq, 4), "scan_48_layers_s": round(48 * t_scan, 4),
        "max_abs_diff": (seq_c - scan_c).abs().max().item(),
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
