"""Counter-based random numbers of the routing model. Every value is a pure function of
(seed, stream, layer, request key, position, expert) through a 32-bit integer hash, so a
token computed twice (a dropped look-ahead step, a preempted request) draws the same numbers,
the batch around it never matters, and eager, graphed, CPU and GPU runs agree. This file is
the torch twin of the helpers in `kernels/triton/routing_model.py` (same integer ops)."""

from __future__ import annotations

import math

import torch

M32 = 0xFFFFFFFF
MIX = 0x45D9F3B  # < 2**27: a uint32 times it fits in int64 without overflow
SECOND = 0x5BD1E995  # salt of a normal's second uniform
STEP, INIT, GUMBEL = 1, 2, 3  # streams: c's innovations, c's fresh starts, the Gumbel noise


def mix32_int(x: int) -> int:
    """`mix32` on a Python int (host-side constants)."""
    x &= M32
    x = (((x >> 16) ^ x) * MIX) & M32
    x = (((x >> 16) ^ x) * MIX) & M32
    return (x >> 16) ^ x


def layer_base(seed: int, stream: int, layer: int) -> int:
    """The hash state of one (seed, stream, layer): a constant of each layer's kernels."""
    return mix32_int(mix32_int((seed & M32) + stream) ^ layer)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """int64 tensor holding uint32 values → their hash (uint32 values in int64)."""
    x = (((x >> 16) ^ x) * MIX) & M32
    x = (((x >> 16) ^ x) * MIX) & M32
    return (x >> 16) ^ x


def token_hash(base: int, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(T,) int64 request keys and positions → (T,) hash states (negative values wrap)."""
    return mix32(mix32(base ^ (keys & M32)) ^ (positions & M32))


def uniform(h: torch.Tensor) -> torch.Tensor:
    """uint32 hashes → float32 in (0, 1): the top 24 bits, centred (exact in float32)."""
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)


def expert_hashes(tok: torch.Tensor, num_experts: int) -> torch.Tensor:
    """(T,) token hash states → (T, E) one per expert."""
    e = torch.arange(num_experts, dtype=torch.int64, device=tok.device)
    return mix32(tok[:, None] ^ e[None, :])


def normal(tok: torch.Tensor, num_experts: int) -> torch.Tensor:
    """(T, E) float32 N(0, 1) by Box–Muller from two uniforms per (token, expert)."""
    h = expert_hashes(tok, num_experts)
    u1, u2 = uniform(h), uniform(mix32(h ^ SECOND))
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)


def gumbel(tok: torch.Tensor, num_experts: int) -> torch.Tensor:
    """(T, E) float32 Gumbel(0, 1)."""
    return -torch.log(-torch.log(uniform(expert_hashes(tok, num_experts))))
