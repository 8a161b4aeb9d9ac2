"""The fused qkv preparation kernel (per-head RMSNorm, RoPE, KV-cache store) on CUDA, against
the unfused Triton launches it replaces (`rms_norm` per head, `apply_rope`, `store_kv`) and
against its reference twin; fp8 caches; replay in a CUDA graph.

The fused kernel repeats the unfused kernels' arithmetic step by step; only the float32 sum of
the norm may run in another order, which moves a float32 result by an ulp and a bfloat16 one
rarely. So against the unfused path: float32 within a few ulps, bfloat16 (and the fp8 cache)
at least 99% bit-equal with the rest within two ulps of the largest value (one e4m3 step).
Against the reference the same bounds, float32 within 1e-4 as the attention tests."""

from __future__ import annotations

import pytest
import torch

from xinfer import kernels
from xinfer.kernels import reference

pytestmark = pytest.mark.gpu
DEV = "cuda"
NUM_BLOCKS, BLOCK_SIZE, MAX_POS = 128, 16, 4096
HEADS = [((32, 4), 128), ((8, 8), 80), ((16, 2), 96)]  # Qwen3-30B-A3B, then odd head dims


@pytest.fixture(autouse=True)
def _triton_or_skip(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("XINFER_DISABLE_TRITON", raising=False)


def _case(dtype, num_tokens, heads, head_dim, norm=True, cache_dtype=None, seed=0, rot=None):
    """Arguments of `qkv_prep`: strided q/k/v views of one qkv output (row stride padded),
    every fifth token padding (slot -1), norm weights near 1 like trained ones."""
    g = torch.Generator(DEV).manual_seed(seed)
    (hq, hk), width = heads, (heads[0] + 2 * heads[1]) * head_dim
    qkv = (3 * torch.randn(num_tokens, width + 64, device=DEV, generator=g)).to(dtype)
    q, k, v = qkv[:, :width].split([hq * head_dim, hk * head_dim, hk * head_dim], dim=-1)
    q, k, v = (t.reshape(num_tokens, -1, head_dim) for t in (q, k, v))
    angles = 6.3 * torch.rand(MAX_POS, (rot or head_dim) // 2, device=DEV, generator=g)
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions = torch.randint(0, MAX_POS, (num_tokens,), device=DEV, generator=g)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, device=DEV, generator=g)[:num_tokens]
    slots[::5] = -1
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, hk, head_dim)
    k_cache, v_cache = torch.randn(shape, device=DEV, generator=g).to(cache_dtype or dtype)
    weights = [1 + 0.3 * torch.randn(head_dim, device=DEV, generator=g) for _ in range(2 * norm)]
    return [q, k, v, positions, cos_sin, k_cache, v_cache, slots, *(w.to(dtype) for w in weights)]


def _unfused(q, k, v, positions, cos_sin, k_cache, v_cache, slots, q_w=None, k_w=None, eps=0.0):
    """The launches the fused kernel replaces."""
    if q_w is not None:
        q, k = kernels.rms_norm(q, q_w, eps), kernels.rms_norm(k, k_w, eps)
    q, k = kernels.apply_rope(q, k, positions, cos_sin)
    kernels.store_kv(k, v, k_cache, v_cache, slots)
    return q


def _run(fn, case, eps=1e-6):
    """fn on fresh copies of the caches → (q, k_cache, v_cache)."""
    k_cache, v_cache = case[5].clone(), case[6].clone()
    weights = case[8:] or [None, None]
    return fn(*case[:5], k_cache, v_cache, case[7], *weights, eps), k_cache, v_cache


def _tol(ref: torch.Tensor) -> dict[str, float]:
    if ref.dtype == torch.float8_e4m3fn:  # one rounding step of e4m3 is 2^-3 relative
        return dict(atol=2**-6, rtol=2**-2)
    return dict(atol=ref.float().abs().max().item() / 64, rtol=2**-6)  # bf16: two ulps


def _assert_like_unfused(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        return
    equal = (got.float() == want.float()).float().mean().item()
    assert equal >= 0.99, f"only {equal:.4f} of the elements are bit-equal to the unfused path"
    torch.testing.assert_close(got.float(), want.float(), **_tol(want))


def _assert_like_reference(got: torch.Tensor, ref: torch.Tensor) -> None:
    if ref.dtype == torch.float32:
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    else:
        torch.testing.assert_close(got.float(), ref.float(), **_tol(ref))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 37, 1000])
@pytest.mark.parametrize("heads, head_dim", HEADS)
@pytest.mark.parametrize("norm", [True, False])
def test_matches_unfused_and_reference(dtype, num_tokens, heads, head_dim, norm):
    case = _case(dtype, num_tokens, heads, head_dim, norm)
    got = _run(kernels.qkv_prep, case)
    for a, b in zip(got, _run(_unfused, case), strict=True):
        _assert_like_unfused(a, b)
    for a, b in zip(got, _run(reference.qkv_prep, case), strict=True):
        _assert_like_reference(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [True, False])
def test_partial_rotary(dtype, norm):
    """Qwen3-Next / Qwen3.5 full attention: 64 of 256 dims rotate, q strided by the gate."""
    case = _case(dtype, 37, (16, 2), 256, norm, seed=3, rot=64)
    q_gate = torch.randn(37, 16, 512, device=DEV, dtype=dtype)
    q_gate[..., :256] = case[0]
    case[0] = q_gate[..., :256]  # (T, Hq, D) with a 2·D head stride
    for a, b in zip(_run(kernels.qkv_prep, case), _run(reference.qkv_prep, case), strict=True):
        _assert_like_reference(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache(dtype):
    """Rounded to e4m3 as `store_kv` does; values past ±448 saturate instead of becoming NaN."""
    case = _case(dtype, 300, (32, 4), 128, cache_dtype=torch.float8_e4m3fn, seed=1)
    case[2][1:40:3] *= 500  # v past the e4m3 range
    got = _run(kernels.qkv_prep, case)
    for a, b in zip(got[1:], _run(_unfused, case)[1:], strict=True):
        _assert_like_unfused(a, b)
        assert torch.isfinite(a.float()).all()
    assert got[2].float().abs().max() == 448.0
    for a, b in zip(got[1:], _run(reference.qkv_prep, case)[1:], strict=True):
        _assert_like_reference(a, b)


def test_cuda_graph_replay():
    """Decode shape, captured once; positions, slots and activations change in place."""
    case = _case(torch.bfloat16, 4, (32, 4), 128)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernels.qkv_prep(*case, 1e-6)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.qkv_prep(*case, 1e-6)
    for seed in (1, 2):
        new = _case(torch.bfloat16, 4, (32, 4), 128, seed=seed)
        for i in (0, 1, 2, 3, 7):  # q, k, v, positions, slots
            case[i].copy_(new[i])
        ref_q, ref_k, ref_v = _run(reference.qkv_prep, case)
        graph.replay()
        _assert_like_reference(out, ref_q)
        _assert_like_reference(case[5], ref_k)
        _assert_like_reference(case[6], ref_v)
