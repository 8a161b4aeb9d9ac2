"""TurboQuant's fixed tables, computed deterministically at start-up: the random rotation R
(D x D orthogonal, the QR of a seeded Gaussian) and the b-bit Lloyd–Max codebook of one
coordinate of a random unit vector in R^D scaled by sqrt(D), whose density is proportional
to (1 - t^2/D)^((D-3)/2) on [-sqrt(D), sqrt(D)] (close to N(0, 1) for large D)."""

from __future__ import annotations

import functools
import math

import torch

ROTATION_SEED = 0x7B0  # one R for every layer and head of every model
_GRID_POINTS = 1 << 16
_LLOYD_ITERS = 400


@functools.cache
def rotation(head_dim: int, seed: int = ROTATION_SEED) -> torch.Tensor:
    """R (D, D) float32 orthogonal on the CPU: Q of the QR of a seeded Gaussian, each column
    signed so that R's diagonal in the QR is positive (a unique, deterministic choice)."""
    g = torch.Generator().manual_seed(seed)
    gauss = torch.randn(head_dim, head_dim, generator=g, dtype=torch.float64)
    q, r = torch.linalg.qr(gauss)
    signs = torch.sign(torch.diagonal(r))
    signs[signs == 0] = 1.0
    return (q * signs).to(torch.float32).contiguous()


@functools.cache
def codebook(head_dim: int, bits: int) -> torch.Tensor:
    """(2^bits,) float64 centroids, sorted and exactly symmetric (c[i] == -c[-1-i]): Lloyd
    iterations on a fine grid of the coordinate density. Only the positive half is iterated
    (the density is even), so the middle boundary is exactly 0."""
    half = 1 << (bits - 1)
    # positive half-line: the density past 12 (or past the support) holds nothing
    top = min(math.sqrt(head_dim), 12.0)
    t = (torch.arange(_GRID_POINTS, dtype=torch.float64) + 0.5) * (top / _GRID_POINTS)
    w = torch.clamp(1.0 - t * t / head_dim, min=0.0) ** ((head_dim - 3) / 2)
    w = w / w.sum()
    cdf = torch.cumsum(w, 0)
    # start at the quantile midpoints of each cell
    c = t[torch.searchsorted(cdf, (torch.arange(half, dtype=torch.float64) + 0.5) / half)]
    for _ in range(_LLOYD_ITERS):
        edges = (c[1:] + c[:-1]) / 2
        cell = torch.bucketize(t, edges)
        mass = torch.zeros(half, dtype=torch.float64).index_add_(0, cell, w)
        moment = torch.zeros(half, dtype=torch.float64).index_add_(0, cell, w * t)
        new = torch.where(mass > 0, moment / mass.clamp_min(1e-300), c)
        if torch.equal(new, c):
            break
        c = new
    return torch.cat([-c.flip(0), c])


def tables(head_dim: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(centroids (2^b,) float32, boundaries (2^b - 1,) float64): the midpoints of the
    float32 centroids, which the store compares against (index = boundaries below t)."""
    centroids = codebook(head_dim, bits).to(torch.float32)
    c64 = centroids.double()
    return centroids, (c64[1:] + c64[:-1]) / 2
