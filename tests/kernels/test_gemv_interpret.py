"""The Triton skinny GEMM (`gemv_launch.linear`) run by Triton's CPU interpreter against
`reference.linear` (F.linear), on sizes off every block multiple, with and without bias and
split-K, and the batch invariance of its rows (bitwise, whatever M).

The interpreter cannot tl.dot bf16 (it multiplies the raw bit patterns), so the fixture
widens bf16 dot operands to float32 first (exact), as it already does for fp8; bf16 casts
still truncate there (the GPU rounds to nearest), so bf16 is only checked loosely.

As in test_moe_kernels_interpret.py, one test re-runs this file in a child pytest with
TRITON_INTERPRET=1, and the cases below run only there."""

from __future__ import annotations

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted

pytest.importorskip("triton")

N, K = 130, 200  # off every BLOCK_N / BLOCK_K multiple


test_interpreter_child = interpreter_child_test(__file__)


def _widen_bf16_dot(monkeypatch) -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    create_dot = interpreter.InterpreterBuilder.create_dot

    def widen(t):
        if t.dtype.scalar != tl.bfloat16:
            return t
        bits = t.data.astype(np.uint32) << 16  # bf16 is the top half of a float32
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def dot(self, a, b, d, *args):
        return create_dot(self, widen(a), widen(b), d, *args)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", dot)


@pytest.fixture
def gl(monkeypatch):
    from xinfer.kernels import gemv_launch
    from xinfer.kernels.triton import gemv as gemv_jit

    require_interpreted(gemv_jit.gemv_kernel)
    _widen_bf16_dot(monkeypatch)
    return gemv_launch


def _inputs(m, n, k, dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, w, b


def _check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if ref.dtype == torch.bfloat16:  # truncating casts: a bf16 ulp or two off
        assert (out.float() - ref.float()).norm() <= 1e-2 * ref.float().norm()
        return
    tol = 1e-5 if ref.dtype == torch.float32 else 2e-3  # fp16: about an ulp of 1..4
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


CONFIGS = [
    dict(block_n=16, block_k=64),
    dict(block_n=32, block_k=32, split_k=4),  # splits of 64, 64, 64 and 8 columns
    dict(block_n=64, block_k=128, split_k=8),  # the same 4 splits, each one masked tile
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@child_only
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,bias", [(1, False), (3, True), (16, True), (16, False)])
def test_linear_matches_reference(gl, cfg, dtype, m, bias) -> None:
    from xinfer.kernels import reference

    x, w, b = _inputs(m, N, K, dtype, bias, seed=m)
    out = gl.linear(x, w, b, config=gl.GemvConfig(**cfg))
    _check(out, reference.linear(x, w, b))


@child_only
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_rows_do_not_depend_on_m(gl, cfg, dtype) -> None:
    x, w, b = _inputs(16, N, K, dtype, bias=True, seed=7)
    config = gl.GemvConfig(**cfg)
    full = gl.linear(x, w, b, config=config)
    for m in (1, 5, 15):
        assert torch.equal(gl.linear(x[:m], w, b, config=config), full[:m])
    for i in (0, 15):  # a row alone gives the bits it has inside the full batch
        assert torch.equal(gl.linear(x[i : i + 1], w, b, config=config), full[i : i + 1])


@child_only
def test_single_output_row(gl) -> None:
    """N = 1 (Qwen2-MoE's shared-expert gate), split-K and bias: one program per split."""
    from xinfer.kernels import reference

    x, w, b = _inputs(3, 1, K, torch.float32, bias=True, seed=5)
    out = gl.linear(x, w, b, config=gl.GemvConfig(block_n=16, block_k=64, split_k=2))
    _check(out, reference.linear(x, w, b))


@child_only
def test_leading_dims_and_strided_rows(gl) -> None:
    from xinfer.kernels import reference

    cfg = gl.GemvConfig(block_n=32, block_k=64)
    x, w, b = _inputs(6, N, K, torch.float16, bias=True, seed=3)
    out = gl.linear(x.view(2, 3, K), w, b, config=cfg)
    assert out.shape == (2, 3, N)
    _check(out.view(6, N), reference.linear(x, w, b))
    x_strided = torch.randn(4, 2 * K, dtype=torch.float16)[:, ::2]  # rows not contiguous in K
    _check(gl.linear(x_strided, w, config=cfg), reference.linear(x_strided, w))


@child_only
def test_bad_inputs_raise(gl) -> None:
    x, w, b = _inputs(17, N, K, torch.float32, bias=True)
    with pytest.raises(ValueError, match="at most 16 rows"):
        gl.linear(x, w, b)
    with pytest.raises(ValueError):
        gl.linear(x[:4].half(), w, b)
    with pytest.raises(ValueError):
        gl.linear(x[:4], w, b[:-1])
    with pytest.raises(ValueError):
        gl.linear(x[:4, :-1], w)
    with pytest.raises(ValueError):
        gl.linear(x[:4], w.t().contiguous().t())
