"""TurboQuant's quantizer (kv/turbo.py, kv/turbo_codebook.py): the codebook, the rotation,
the bit-plane packing and the distortion of quantize → dequantize against Lloyd–Max's."""

from __future__ import annotations

import pytest
import torch

from xinfer.kv import turbo
from xinfer.kv.format import TurboQuant, kv_bytes_per_head
from xinfer.kv.turbo_codebook import codebook, rotation, tables


@pytest.mark.parametrize("head_dim", [8, 64, 128, 256])
@pytest.mark.parametrize("bits", [3, 4])
def test_codebook_is_sorted_and_symmetric(head_dim, bits):
    c = codebook(head_dim, bits)
    assert c.shape == (1 << bits,) and c.dtype == torch.float64
    assert torch.all(c[1:] > c[:-1])
    assert torch.equal(c, -c.flip(0))  # exactly: the middle boundary is 0
    centroids, boundaries = tables(head_dim, bits)
    assert boundaries[(1 << bits) // 2 - 1] == 0
    assert torch.all(boundaries > centroids[:-1].double()) and torch.all(
        boundaries < centroids[1:].double()
    )


def test_codebook_approaches_the_gaussian_lloyd_max():
    # Max (1960): the 3-bit Lloyd–Max quantizer of N(0, 1) has levels ±0.2451, 0.7560,
    # 1.3439, 2.1520; a coordinate of a scaled unit vector in R^1024 is nearly N(0, 1)
    gauss = torch.tensor([0.2451, 0.7560, 1.3439, 2.1520], dtype=torch.float64)
    assert torch.allclose(codebook(1024, 3)[4:], gauss, rtol=2e-3, atol=0)
    # a small D has a narrower support (|t| <= sqrt(D)): the outer levels move in
    assert codebook(8, 3)[-1] < codebook(128, 3)[-1] < codebook(1024, 3)[-1]


@pytest.mark.parametrize("head_dim", [8, 80, 128])
def test_rotation_is_orthogonal_and_deterministic(head_dim):
    r = rotation(head_dim)
    eye = torch.eye(head_dim)
    torch.testing.assert_close(r @ r.T, eye, atol=2e-6, rtol=0)
    rotation.cache_clear()  # computed afresh: the same bits
    assert torch.equal(rotation(head_dim), r)
    assert not torch.equal(rotation(head_dim, seed=1), r)


@pytest.mark.parametrize("bits", [3, 4])
def test_pack_unpack_round_trip(bits):
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 1 << bits, (5, 3, 40), generator=g)
    codes = turbo.pack(idx, bits)
    assert codes.shape == (5, 3, bits * 5) and codes.dtype == torch.uint8
    assert torch.equal(turbo.unpack(codes, bits), idx)
    one = torch.zeros(1, 16, dtype=torch.long)
    one[0, 9] = 0b101 if bits == 3 else 0b1001
    codes = turbo.pack(one, bits).view(-1).tolist()
    if bits == 4:  # two a byte: coordinate 9 in byte 4's high nibble
        assert codes == [0, 0, 0, 0, 0x90, 0, 0, 0]
    else:  # low bit pairs four a byte (9 = 4 * 2 + 1: byte 2, bits 2-3), then high bits
        assert codes == [0, 0, 0b01 << 2, 0, 0, 1 << 1]


# Relative MSE |y - s c|^2 / |y|^2 on Gaussian vectors at D = 128. Lloyd–Max's per-coordinate
# MSE is 0.00950 (4 bits) and 0.03454 (3 bits); normalising each vector by its own norm and
# the least-squares scale give slightly less (measured: 0.0092 and 0.0336).
@pytest.mark.parametrize("bits, lloyd_max", [(4, 0.00950), (3, 0.03454)])
def test_quantize_dequantize_mse_near_lloyd_max(bits, lloyd_max):
    head_dim = 128
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4096, head_dim, generator=g)
    y = x @ rotation(head_dim).T
    centroids, boundaries = tables(head_dim, bits)
    idx, scales = turbo.quantize(y, centroids, boundaries)
    codes = turbo.pack(idx, bits)
    back = turbo.dequantize(codes, scales, centroids, bits)
    rel = (((back - y) ** 2).sum(-1) / (y**2).sum(-1)).mean().item()
    assert 0.9 * lloyd_max < rel < 1.02 * lloyd_max, rel
    # the least-squares scale beats sigma = |y| / sqrt(D)
    sigma = y.norm(dim=-1, keepdim=True) / head_dim**0.5
    rel_sigma = (((centroids[idx] * sigma - y) ** 2).sum(-1) / (y**2).sum(-1)).mean().item()
    assert rel < rel_sigma
    # rotating back gives the same error on x (R is orthogonal)
    rel_x = (((back @ rotation(head_dim) - x) ** 2).sum(-1) / (x**2).sum(-1)).mean().item()
    assert abs(rel_x - rel) < 1e-3 * rel


def test_indices_follow_the_boundaries_and_zero_rows_stay_zero():
    centroids, boundaries = tables(16, 4)
    y = torch.zeros(3, 16)
    y[1] = torch.linspace(-3, 3, 16)
    idx, scales = turbo.quantize(y, centroids, boundaries)
    assert scales[0] == 0 and torch.isfinite(scales).all()
    t = y[1].double() / (y[1].double().norm() / 4)
    want = torch.tensor([int((b < v).sum()) for v in t for b in [boundaries]])
    assert torch.equal(idx[1], want)


def test_bytes_per_head_and_bad_head_dim():
    assert kv_bytes_per_head(torch.bfloat16, 128) == 256
    assert kv_bytes_per_head(TurboQuant(4), 128) == 66
    assert kv_bytes_per_head(TurboQuant(3), 128) == 50
    from xinfer import UserError

    with pytest.raises(UserError, match=r"multiple of 8.*head_dim is 100"):
        kv_bytes_per_head(TurboQuant(4), 100)
    with pytest.raises(ValueError, match="bits"):
        TurboQuant(2)
