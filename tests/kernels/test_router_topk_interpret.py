"""The router GEMV with its top-k in one launch (`router_launch.router_topk`) in Triton's CPU
interpreter: weights and ids equal, bit for bit, the two launches' (`gemv_launch.linear` on
the same tiles, then `moe_launch.route_topk`) for routers of 128, 60 (not a power of two) and
8 experts, split K (bfloat16 tiles) and unsplit (float32), 1, 5 and 16 rows, top-k 1, 4 and
8, with and without renormalisation; the arrival counter is zero after each call; batches
past 16 rows, a bias-free mismatch or too many experts are left to the two launches (None).
(The GPU's memory ordering is `test_router_topk_gpu.py`'s.)

Bits are compared as integers: the interpreter's bfloat16 tl.dot is wrong (raw bits) and may
give NaN, which both paths must then give alike.

Runs in a child pytest with TRITON_INTERPRET=1 (see interpreter_child.py)."""

from __future__ import annotations

import pytest
import torch
from fused_tails import assert_counters_zero
from interpreter_child import child_only, interpreter_child_test, require_interpreted

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)
CPU = torch.device("cpu")
# (E, K): Qwen3-30B-A3B's router shape cut in K (the table misses it: ROUTER_CONFIG), and
# Qwen1.5's 60 experts and Mixtral's 8 likewise
ROUTERS = {"e128": (128, 512), "e60": (60, 512), "e8": (8, 256)}


@pytest.fixture(scope="module")
def rl():
    from xinfer.kernels import router_launch
    from xinfer.kernels.triton import router_topk

    require_interpreted(router_topk.router_topk_kernel)
    return router_launch


def _two_launches(rl, x, w, top_k, renormalize):
    from xinfer.kernels import gemv_launch, moe_launch

    cfg = rl.config(w.shape[0], w.shape[1], x.shape[0], x.dtype)
    logits = gemv_launch.linear(x, w, config=cfg)
    return moe_launch.route_topk(logits, top_k, renormalize)


def _inputs(router: str, rows: int, dtype: torch.dtype, seed: int):
    experts, k = ROUTERS[router]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(dtype)
    w = (torch.randn(experts, k, generator=g) / k**0.5).to(dtype)
    return x, w


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@child_only
@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_one_launch_has_the_two_launches_bits(rl, router, dtype, rows) -> None:
    top_k = min(8, ROUTERS[router][0])
    x, w = _inputs(router, rows, dtype, seed=rows)
    want_w, want_i = _two_launches(rl, x, w, top_k, renormalize=True)
    got = rl.router_topk(x, w, top_k, renormalize=True)
    assert got is not None
    assert torch.equal(_bits(got[0]), _bits(want_w))
    assert torch.equal(got[1], want_i)
    assert_counters_zero(CPU)
    again = rl.router_topk(x, w, top_k, renormalize=True)
    assert torch.equal(_bits(again[0]), _bits(want_w)) and torch.equal(again[1], want_i)


@child_only
@pytest.mark.parametrize("top_k,renormalize", [(1, False), (4, True), (8, False)])
def test_top_k_and_renormalisation(rl, top_k, renormalize) -> None:
    x, w = _inputs("e60", 3, torch.float32, seed=top_k)
    want_w, want_i = _two_launches(rl, x, w, top_k, renormalize)
    got_w, got_i = rl.router_topk(x, w, top_k, renormalize)
    assert torch.equal(_bits(got_w), _bits(want_w)) and torch.equal(got_i, want_i)
    # and the choice is the reference's (float32 on the CPU: the same experts)
    from xinfer.kernels import reference

    ref_w, ref_i = reference.route_topk(x @ w.t(), top_k, renormalize)
    assert torch.equal(got_i, ref_i)
    torch.testing.assert_close(got_w, ref_w)


@child_only
def test_left_to_two_launches(rl) -> None:
    x, w = _inputs("e8", 17, torch.float32, seed=0)
    assert rl.router_topk(x, w, 2, True) is None  # a prompt-sized batch
    assert rl.router_topk(x[:4], w.to(torch.float16), 2, True) is None  # mixed dtypes
    big = torch.zeros(rl.MAX_EXPERTS + 1, w.shape[1])
    assert rl.router_topk(x[:4], big, 2, True) is None
    with pytest.raises(ValueError, match="top_k"):
        rl.router_topk(x[:4], w, 9, True)


@child_only
def test_nan_logits_choose_real_experts(rl) -> None:
    """A NaN in the input makes a row's logits NaN: its ids are still real experts in [0, E),
    and the same as the two launches' (the order-preserving packed keys rank NaN with the
    padding, before it)."""
    x, w = _inputs("e60", 2, torch.float32, seed=3)
    x[1, 7] = float("nan")
    want_w, want_i = _two_launches(rl, x, w, 4, True)
    got_w, got_i = rl.router_topk(x, w, 4, True)
    assert torch.equal(got_i, want_i) and ((got_i >= 0) & (got_i < 60)).all()
    assert torch.equal(_bits(got_w), _bits(want_w))
