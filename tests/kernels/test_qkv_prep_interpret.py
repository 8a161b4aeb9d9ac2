"""The fused qkv preparation kernel (per-head RMSNorm, RoPE, KV-cache store) run by Triton's
CPU interpreter against its reference twin (`rms_norm`, `apply_rope`, `store_kv` in turn), on
strided views of a qkv projection output, GQA, head dims that are not powers of two and
padding slots. The interpreter truncates float32 → bfloat16 casts where the GPU rounds to
nearest, so bfloat16 gets two ulps of the largest value; float32/float16 are checked tightly.
Its float32 → e4m3 cast loses a rounding carry into the next binade (0.124 → 0.0625), so the
fp8 case uses values that e4m3 holds exactly (the GPU test covers fp8 rounding).

TRITON_INTERPRET must be set before the kernels are decorated and must not leak into GPU
tests of the same process, so in a normal run one test re-runs this file in a child pytest
with TRITON_INTERPRET=1, and the cases below run only there."""

from __future__ import annotations

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted

pytest.importorskip("triton")


test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(scope="module")
def launch():
    from xinfer.kernels import qkv_prep_launch
    from xinfer.kernels.triton import qkv_prep as jit

    require_interpreted(jit.qkv_prep_kernel)
    return qkv_prep_launch


NUM_BLOCKS, BLOCK_SIZE, MAX_POS = 5, 4, 64


def _case(dtype, head_dim, hq, hk, norm=True, cache_dtype=None, num_tokens=6, seed=0, rot=None):
    """Arguments of `qkv_prep`: q/k/v are views into a qkv output with a padded row stride;
    every third token is padding (slot -1)."""
    g = torch.Generator().manual_seed(seed)
    width = (hq + 2 * hk) * head_dim
    qkv = (3 * torch.randn(num_tokens, width + 16, generator=g)).to(dtype)[:, :width]
    q, k, v = qkv.split([hq * head_dim, hk * head_dim, hk * head_dim], dim=-1)
    q, k, v = (t.reshape(num_tokens, -1, head_dim) for t in (q, k, v))
    angles = 6.3 * torch.rand(MAX_POS, (rot or head_dim) // 2, generator=g)  # rot: partial
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions = torch.randint(0, MAX_POS, (num_tokens,), generator=g)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=g)[:num_tokens]
    slots[1::3] = -1
    cache_shape = (2, NUM_BLOCKS, BLOCK_SIZE, hk, head_dim)
    k_cache, v_cache = torch.randn(cache_shape, generator=g).to(cache_dtype or dtype)
    weights = [torch.randn(head_dim, generator=g).to(dtype) for _ in range(2)] if norm else []
    return [q, k, v, positions, cos_sin, k_cache, v_cache, slots, *weights]


def _run(fn, case, eps=1e-6):
    """fn on fresh copies of the caches → (q, k_cache, v_cache)."""
    k_cache, v_cache = case[5].clone(), case[6].clone()
    weights = case[8:] or [None, None]
    q = fn(*case[:5], k_cache, v_cache, case[7], *weights, eps)
    return q, k_cache, v_cache


def _tol(ref: torch.Tensor) -> dict[str, float]:
    if ref.dtype == torch.bfloat16:  # two ulps of the largest value (2^-7 relative each)
        return dict(atol=ref.float().abs().max().item() / 64, rtol=2**-6)
    return dict(atol=2e-3, rtol=2e-3) if ref.dtype == torch.float16 else dict(atol=1e-5, rtol=1e-5)


def _check(got, ref, case):
    for a, b in zip(got, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, **_tol(b))
    untouched = torch.ones(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
    untouched[case[7][case[7] >= 0]] = False  # padding rows and unused slots stay as they were
    for cache, before in zip(got[1:], case[5:7]):
        assert torch.equal(cache.flatten(0, 1)[untouched], before.flatten(0, 1)[untouched])


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim, hq, hk", [(80, 6, 2), (96, 4, 1), (24, 2, 2)])
def test_norm_rope_store(launch, dtype, head_dim, hq, hk):
    from xinfer.kernels import reference

    case = _case(dtype, head_dim, hq, hk)
    _check(_run(launch.qkv_prep, case), _run(reference.qkv_prep, case), case)


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rope_store_without_norm(launch, dtype):
    from xinfer.kernels import reference

    case = _case(dtype, 80, 6, 2, norm=False, seed=1)
    _check(_run(launch.qkv_prep, case), _run(reference.qkv_prep, case), case)


@child_only
def test_float32_into_bfloat16_cache(launch):
    from xinfer.kernels import reference

    case = _case(torch.float32, 96, 4, 2, cache_dtype=torch.bfloat16, seed=2)
    got, ref = _run(launch.qkv_prep, case), _run(reference.qkv_prep, case)
    torch.testing.assert_close(got[0], ref[0], **_tol(ref[0]))
    for a, b in zip(got[1:], ref[1:]):
        torch.testing.assert_close(a, b, **_tol(b))


@child_only
def test_fp8_cache_saturates(launch):
    """Values e4m3 holds exactly and a rotation by 0, so only the saturation can round."""
    from xinfer.kernels import reference

    fp8 = torch.float8_e4m3fn
    case = _case(torch.float32, 80, 4, 2, norm=False, cache_dtype=fp8, seed=3)
    for t in case[:3]:
        t.copy_(t.to(fp8).float())
    case[1][0, 0, :5] = torch.tensor([1e4, -1e4, 449.0, 600.0, -3e38])
    case[2][2, 1, -3:] = torch.tensor([-1e4, 5e3, 448.0])
    case[4][:, :40], case[4][:, 40:] = 1.0, 0.0  # cos 1, sin 0
    case[7].copy_(torch.tensor([7, -1, 12, 3, -1, 0]))  # the large values are stored
    got, ref = _run(launch.qkv_prep, case), _run(reference.qkv_prep, case)
    assert torch.equal(got[0], ref[0])
    for a, b in zip(got[1:], ref[1:]):
        assert torch.equal(a.float(), b.float()) and a.float().abs().max() == 448.0


@child_only
def test_promoting_norm_weight_falls_back_to_reference(launch):
    """float32 norm weights on bfloat16 activations promote q/k to float32, as HF does."""
    from xinfer.kernels import reference

    case = _case(torch.bfloat16, 24, 2, 1, seed=4)
    case[8:] = [w.float() for w in case[8:]]
    got, ref = _run(launch.qkv_prep, case), _run(reference.qkv_prep, case)
    assert got[0].dtype == torch.float32
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [True, False])
def test_partial_rotary(launch, dtype, norm):
    """A table narrower than the head (Qwen3-Next: a quarter): the first dims rotate, the
    rest pass through, normalised with the rest of the head."""
    from xinfer.kernels import reference

    case = _case(dtype, 80, 4, 2, norm=norm, seed=5, rot=20)
    _check(_run(launch.qkv_prep, case), _run(reference.qkv_prep, case), case)
