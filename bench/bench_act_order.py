"""Act-order GPTQ (desc_act: x gathered through each weight's perm) against plain GPTQ on the
same shapes and codes, on one GPU: decode linears (qkv 5120 x 2048, o_proj 2048 x 4096 at 1
and 8 rows), prefill linears (2,048 rows), the routed experts of Qwen3-30B-A3B (H 2048, I 768,
128 experts, top 8) at 1, 8 and 2,048 tokens. Each act-order result is first checked against
the plain kernel on x permuted beforehand (bits) or the twin (tolerance). Times in µs
(`triton.testing.do_bench_cudagraph`, median).

    python3 bench/bench_act_order.py [--out results.json]"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch
import triton

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / p) for p in ("src", "tests")]
from quant_weights import random_weights  # noqa: E402

from xinfer.kernels import quant_launch as ql  # noqa: E402
from xinfer.kernels import reference  # noqa: E402
from xinfer.quant.gptq import GptqInt4  # noqa: E402

DEV = torch.device("cuda", 0)
ACT = GptqInt4(group_size=128, has_zero=False, act_order=True)
PLAIN = GptqInt4(group_size=128, has_zero=False)


def _time(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return 1000 * triton.testing.do_bench_cudagraph(fn, rep=200)


def _plain(t: dict) -> dict:
    return {n: v for n, v in t.items() if n != "perm"}


def linears(rows: list[int]) -> list[dict]:
    out = []
    for n, k in ((5120, 2048), (2048, 4096)):
        act = random_weights(ACT, n, k, seed=n, device=DEV)
        plain = _plain(act)
        for m in rows:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
            got = ql.linear(x, ACT, act, None, n, k)
            ref = ACT.reference_linear(x, act, None, n, k).float()
            assert (got.float() - ref).norm() / ref.norm() < 1e-2, (n, k, m)
            # whether the gather left the plain kernel's bits (x permuted beforehand): not
            # required (the compiler may contract differently), reported
            sorted_x = x[:, act["perm"].long()].contiguous()
            same = torch.equal(got, ql.linear(sorted_x, PLAIN, plain, None, n, k))
            t_act = _time(partial(ql.linear, x, ACT, act, None, n, k))
            t_plain = _time(partial(ql.linear, x, PLAIN, plain, None, n, k))
            out.append(dict(what=f"linear {m}x{n}x{k}", actorder_us=t_act, plain_us=t_plain,
                            plain_bits=same))  # fmt: skip
            print(out[-1], flush=True)
    return out


def experts(tokens: list[int]) -> list[dict]:
    num_experts, top_k, hidden, inter = 128, 8, 2048, 768
    w13 = random_weights(ACT, 2 * inter, hidden, seed=1, count=num_experts, device=DEV)
    w2 = random_weights(ACT, hidden, inter, seed=2, count=num_experts, device=DEV)
    p13, p2 = _plain(w13), _plain(w2)
    out = []
    for t in tokens:
        x = torch.randn(t, hidden, device=DEV, dtype=torch.bfloat16)
        weights, ids = reference.route_topk(torch.randn(t, num_experts, device=DEV), top_k, True)
        got = ACT.triton_moe(x, ids, weights, w13, w2, inter)
        ref = ACT.reference_moe(x, ids, weights, w13, w2, inter).float()
        assert (got.float() - ref).norm() / ref.norm() < 1e-2, t
        t_act = _time(partial(ACT.triton_moe, x, ids, weights, w13, w2, inter))
        t_plain = _time(partial(PLAIN.triton_moe, x, ids, weights, p13, p2, inter))
        out.append(dict(what=f"moe T={t}", actorder_us=t_act, plain_us=t_plain))
        print(out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = linears([1, 8, 2048]) + experts([1, 8, 2048])
    print(torch.cuda.get_device_name(0))
    if args.out:
        Path(args.out).write_text(json.dumps(dict(device=torch.cuda.get_device_name(0),
                                                  rows=rows), indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
