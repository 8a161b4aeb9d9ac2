"""The skinny-GEMM path of `kernels.linear`: on the CPU, the config table's rules and the
dispatch (`wants`, F.linear bits unchanged); on CUDA (`gpu`), the Triton kernel against
F.linear (cuBLAS) on the real decode shapes, bitwise batch invariance through the dispatch
(so across the table's M buckets), odd sizes, split-K, and CUDA-graph capture.

Tolerances (GPU): both sides accumulate in float32 and round once, only the order differs,
so bf16/fp16 outputs are equal or an ulp apart: 1e-2 of max|ref| elementwise and 5e-3 in
norm; fp32 1e-4 relative (F.linear does not use tf32 unless asked to, nor does the kernel)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xinfer import kernels
from xinfer.kernels import reference

pytest.importorskip("triton")

from xinfer.kernels import gemv_launch as gl  # noqa: E402

C = gl.GemvConfig
DEV = "cuda"


def _inputs(m, n, k, dtype, bias=False, device="cpu", seed=0):
    g = torch.Generator(device).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=device).to(dtype)
    w = (torch.randn(n, k, generator=g, device=device) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g, device=device).to(dtype) if bias else None
    return x, w, b


# ---- CPU: table rules and dispatch --------------------------------------------------------


def test_shipped_table_covers_every_m() -> None:
    for n, k, _ in gl.GEMV_TABLE:
        for m in range(1, gl.MAX_M + 1):
            gl.select(n, k, m, torch.bfloat16)  # a bucket for every M (StopIteration if not)


@pytest.mark.parametrize(
    "table,match",
    [
        ({(64, 32, 8): C(16, 32)}, "max_m = 16"),
        ({(64, 32, 17): C(16, 32)}, "max_m must be"),
        ({(64, 32, 8): None, (64, 32, 16): C(16, 32)}, "cuBLAS for some"),
        ({(64, 32, 8): C(16, 32, split_k=2), (64, 32, 16): C(16, 32)}, "split_k"),
    ],
)
def test_table_rejects_m_dependent_entries(table, match) -> None:
    with pytest.raises(ValueError, match=match):
        gl._index_table(table)


def test_select_takes_the_smallest_bucket_that_fits(monkeypatch) -> None:
    a, b, c = C(16, 32), C(32, 64), C(64, 64, num_warps=8)
    table = {(64, 32, 1): a, (64, 32, 8): b, (64, 32, 16): c, (96, 32, 16): None}
    monkeypatch.setattr(gl, "_BY_SHAPE", gl._index_table(table))
    picks = [gl.select(64, 32, m, torch.float16) for m in range(1, 17)]
    assert picks == [a] + [b] * 7 + [c] * 8
    assert gl.select(96, 32, 4, torch.float16) is None
    assert gl.select(80, 32, 4, torch.float16) is None  # not in the table: cuBLAS
    assert gl.select(64, 32, 4, torch.float32) == gl.FP32_CONFIG
    x, w, _ = _inputs(4, 96, 32, torch.float16)
    assert not gl.wants(x, w, None)  # the table picks cuBLAS


def test_wants_only_decode_batches_of_half_types(monkeypatch) -> None:
    monkeypatch.setattr(gl, "_BY_SHAPE", gl._index_table({(130, 200, 16): C(16, 64)}))
    x, w, b = _inputs(16, 130, 200, torch.bfloat16, bias=True)
    assert gl.wants(x, w, b) and gl.wants(x[:1], w, None) and gl.wants(x.view(2, 8, 200), w, b)
    assert not gl.wants(torch.cat([x, x[:1]]), w, b)  # 17 rows
    assert not gl.wants(x[:0], w, b)
    assert not gl.wants(x.float(), w.float(), b.float())
    assert not gl.wants(x, w, b.half())
    assert not gl.wants(x, w.t().contiguous().t(), b)  # weight not contiguous
    assert not gl.wants(x[:, :100], w, b)  # K mismatch: F.linear raises its own error
    assert not gl.wants(x[:, :64], torch.randn(130, 64).to(x.dtype), b)  # shape not tuned


def test_cpu_linear_is_f_linear_bitwise() -> None:
    from xinfer.layers.linear import MergedLinear

    x, w, b = _inputs(3, 130, 200, torch.bfloat16, bias=True)
    assert torch.equal(kernels.linear(x, w, b), F.linear(x, w, b))
    layer = MergedLinear(200, {"a": 100, "b": 30}, bias=True).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    assert torch.equal(layer(x), F.linear(x, w, b))


# ---- GPU ----------------------------------------------------------------------------------

# (N, K, bias): every shape the table sends to Triton, with a bias on one of them (odd
# sizes with explicit configs: test_configs_on_odd_sizes)
REAL_SHAPES = sorted({(n, k) for (n, k, _), cfg in gl.GEMV_TABLE.items() if cfg is not None})
SHAPES = [(n, k, (n, k) == (2048, 4096)) for n, k in REAL_SHAPES]


def _check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    out, ref = out.float(), ref.float()
    scale = ref.abs().max().item()
    err = (out - ref).abs().max().item()
    rel_norm = ((out - ref).norm() / ref.norm()).item()
    assert err <= 1e-2 * scale and rel_norm <= 5e-3, (err, scale, rel_norm)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,bias", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_dispatch_matches_f_linear(n, k, bias, dtype) -> None:
    x, w, b = _inputs(16, n, k, dtype, bias, device=DEV)
    assert gl.wants(x, w, b), "shape expected on the Triton path"
    for m in (1, 5, 16):
        _check(kernels.linear(x[:m], w, b), F.linear(x[:m], w, b))


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,bias", SHAPES)
def test_rows_do_not_depend_on_m(n, k, bias) -> None:
    """Through the dispatch, so across the table's M buckets: bitwise."""
    x, w, b = _inputs(16, n, k, torch.bfloat16, bias, device=DEV, seed=1)
    full = kernels.linear(x, w, b)
    for m in range(1, 16):
        assert torch.equal(kernels.linear(x[:m], w, b), full[:m]), m
    for i in (3, 15):  # a row alone gives the bits it has inside the full batch
        assert torch.equal(kernels.linear(x[i : i + 1], w, b), full[i : i + 1]), i


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg",
    [C(16, 64, 4, 2), C(32, 32, 4, 3, split_k=4), C(64, 128, 8, 2, split_k=8), C(128, 64, 8, 2)],
    ids=str,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_configs_on_odd_sizes(cfg, dtype) -> None:
    for m in (1, 3, 16):
        x, w, b = _inputs(m, 130, 200, dtype, bias=True, device=DEV, seed=m)
        out = gl.linear(x, w, b, config=cfg)
        ref = reference.linear(x, w, b)
        if dtype == torch.float32:
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
        else:
            _check(out, ref)


@pytest.mark.gpu
def test_cuda_graph_capture() -> None:
    x, w, b = _inputs(4, 2048, 4096, torch.bfloat16, bias=True, device=DEV)
    static_x = x.clone()
    eager = kernels.linear(static_x, w, b)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = kernels.linear(static_x, w, b)
    x2 = torch.randn_like(x)
    static_x.copy_(x2)
    graph.replay()
    assert torch.equal(static_out, kernels.linear(x2, w, b))
    static_x.copy_(x)
    graph.replay()
    assert torch.equal(static_out, eager)


@pytest.mark.gpu
def test_linear_layer_takes_gemv_for_decode_only() -> None:
    from xinfer.layers.linear import Linear

    layer = Linear(4096, 2048).to(DEV, torch.bfloat16)  # o_proj: a Triton shape in the table
    torch.nn.init.normal_(layer.weight, std=4096**-0.5)
    x = torch.randn(17, 4096, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(layer(x[:8]), gl.linear(x[:8], layer.weight))
        assert torch.equal(layer(x), F.linear(x, layer.weight))  # 17 rows: cuBLAS
