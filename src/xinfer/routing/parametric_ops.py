"""The two per-layer steps of the routing model, each a Triton kernel on CUDA
(`kernels/triton/routing_model.py`) and a pure-torch twin here (CPU, and the ground truth):

`advance_state`: per sequence, walk the drifting preference c over the call's tokens
(carry-in from the request's state row, an AR(1) step per token, a fresh start when the row
holds no predecessor), write c per token and the last one back to the state row.
`select_experts`: per token, top-k of `popularity + s·τ·c + Gumbel`; weights from the router
logits at those ids (float32 softmax, renormalised as the model does)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from xinfer import kernels
from xinfer.routing import noise


@dataclass
class RoutingState:
    """One layer's per-request state: row r holds c after position `pos[r]` of request
    `key[r]`; the last row is scratch (padding rows of a CUDA graph write there)."""

    c: torch.Tensor  # (R + 1, E) float32
    pos: torch.Tensor  # (R + 1,) int64, -1 = empty
    key: torch.Tensor  # (R + 1,) int64, -1 = empty (real keys are >= 0)

    @classmethod
    def empty(cls, num_rows: int, num_experts: int, device: torch.device) -> RoutingState:
        return cls(
            torch.zeros(num_rows + 1, num_experts, dtype=torch.float32, device=device),
            torch.full((num_rows + 1,), -1, dtype=torch.int64, device=device),
            torch.full((num_rows + 1,), -1, dtype=torch.int64, device=device),
        )

    @property
    def scratch_row(self) -> int:
        return self.c.shape[0] - 1


@dataclass(frozen=True)
class LayerConstants:
    """What one layer's kernels need besides the batch: hash bases and the scalars."""

    step_base: int  # noise.layer_base(seed, STEP, layer)
    init_base: int
    gumbel_base: int
    phi: float
    innovation: float  # sqrt(1 - phi^2)
    drift_scale: float  # s_l * tau
    popularity: torch.Tensor  # (E,) float32: s_l * sigma * z[l]


@dataclass(frozen=True)
class SequenceBatch:
    """The call's sequences (from the forward context): tokens of sequence b are
    [query_start_loc[b], query_start_loc[b+1]), at positions ending at seq_lens[b] - 1."""

    query_start_loc: torch.Tensor  # (B + 1,) int32
    seq_lens: torch.Tensor  # (B,) int32
    rows: torch.Tensor  # (B,) int64 state row of each sequence's request
    keys: torch.Tensor  # (B,) int64 key of each sequence's request, -1 = padding
    is_decode: bool  # host-side: one token per sequence (no scan needed)


def advance_state(
    state: RoutingState, batch: SequenceBatch, const: LayerConstants, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """→ c (T, E) float32, token keys (T,) int64, token positions (T,) int64."""
    if kernels.use_triton(state.c):
        from xinfer.routing import parametric_launch

        return parametric_launch.advance_state(state, batch, const, num_tokens)
    return advance_state_reference(state, batch, const, num_tokens)


def select_experts(
    c: torch.Tensor,
    token_keys: torch.Tensor,
    token_positions: torch.Tensor,
    router_logits: torch.Tensor,
    const: LayerConstants,
    top_k: int,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """→ (weights float32 (T, k), ids int32 (T, k))."""
    if kernels.use_triton(c):
        from xinfer.routing import parametric_launch

        return parametric_launch.select_experts(
            c, token_keys, token_positions, router_logits, const, top_k, renormalize
        )
    return select_experts_reference(
        c, token_keys, token_positions, router_logits, const, top_k, renormalize
    )


def token_layout(batch: SequenceBatch, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(T,) sequence index and position of every token, without reading the device."""
    qsl = batch.query_start_loc.long()
    num_seqs = batch.seq_lens.shape[0]
    if batch.is_decode:
        seq = torch.arange(num_tokens, device=qsl.device)
    else:
        lens = qsl[1:] - qsl[:-1]
        seq = torch.repeat_interleave(
            torch.arange(num_seqs, device=qsl.device), lens, output_size=num_tokens
        )
    offset = torch.arange(num_tokens, device=qsl.device) - qsl[:-1][seq]
    first = batch.seq_lens.long() - (qsl[1:] - qsl[:-1])  # (B,) position of each first token
    return seq, first[seq] + offset


def ar1_scan(x: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """y[i] = decay[i]·y[i-1] + x[i] (y[-1] = 0) for x (T, E), decay (T,), in log2(T) rounds
    (Hillis–Steele over the affine maps; decay 0 starts a new segment)."""
    y, a, d = x, decay, 1
    while d < x.shape[0]:
        y = torch.cat([y[:d], y[d:] + a[d:, None] * y[:-d]])
        a = torch.cat([a[:d], a[d:] * a[:-d]])
        d *= 2
    return y


def advance_state_reference(
    state: RoutingState, batch: SequenceBatch, const: LayerConstants, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The twin of `routing_state_kernel`: vectorised over tokens, the walk along each
    sequence done by `ar1_scan` (the kernel walks it token by token)."""
    num_experts = state.c.shape[1]
    seq, pos = token_layout(batch, num_tokens)
    keys, rows = batch.keys[seq], batch.rows[seq]
    qsl = batch.query_start_loc.long()
    idx = torch.arange(num_tokens, device=pos.device)
    is_first, is_last = idx == qsl[:-1][seq], idx == qsl[1:][seq] - 1
    eps = noise.normal(noise.token_hash(const.step_base, keys, pos), num_experts)
    fresh = noise.normal(noise.token_hash(const.init_base, keys, pos), num_experts)
    prev_c, prev_pos, prev_key = state.c[rows], state.pos[rows], state.key[rows]
    valid = keys >= 0
    is_same_request = (valid & (prev_key == keys))[:, None]
    follows = is_same_request & ((prev_pos == pos - 1) & (pos > 0))[:, None]
    repeats = is_same_request & (prev_pos == pos)[:, None]  # a dropped step computed it
    first_c = torch.where(
        follows,
        const.phi * prev_c + const.innovation * eps,
        torch.where(repeats, prev_c, fresh),
    )
    x = torch.where(is_first[:, None], first_c, const.innovation * eps)
    if batch.is_decode:
        c = x
    else:
        c = ar1_scan(x, torch.where(is_first, 0.0, const.phi).to(torch.float32))
    # Only the last token of a real sequence writes its row; every other one the scratch row.
    target = torch.where(is_last & valid, rows, state.scratch_row)
    state.c.index_copy_(0, target, c)
    state.pos.index_copy_(0, target, pos)
    state.key.index_copy_(0, target, keys)
    return c, keys, pos


def select_experts_reference(
    c: torch.Tensor,
    token_keys: torch.Tensor,
    token_positions: torch.Tensor,
    router_logits: torch.Tensor,
    const: LayerConstants,
    top_k: int,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_experts = c.shape[1]
    g = noise.gumbel(noise.token_hash(const.gumbel_base, token_keys, token_positions), num_experts)
    logits = const.popularity[None, :] + const.drift_scale * c + g  # (T, E)
    ids = logits.topk(top_k, dim=-1).indices.to(torch.int32)
    return weights_at(router_logits, ids, renormalize), ids


def weights_at(router_logits: torch.Tensor, ids: torch.Tensor, renormalize: bool) -> torch.Tensor:
    """(T, k) float32 routing weights of the chosen ids from the real router logits: float32
    softmax over all experts, gathered at `ids`, renormalised over k when the model does."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights = probs.gather(1, ids.long())
    return weights / weights.sum(dim=-1, keepdim=True) if renormalize else weights


def layer_constants(
    seed: int, layer: int, scale: float, sigma: float, tau: float, phi: float, z: torch.Tensor
) -> LayerConstants:
    return LayerConstants(
        step_base=noise.layer_base(seed, noise.STEP, layer),
        init_base=noise.layer_base(seed, noise.INIT, layer),
        gumbel_base=noise.layer_base(seed, noise.GUMBEL, layer),
        phi=phi,
        innovation=math.sqrt(1.0 - phi * phi),
        drift_scale=scale * tau,
        popularity=(scale * sigma * z).to(torch.float32),
    )
