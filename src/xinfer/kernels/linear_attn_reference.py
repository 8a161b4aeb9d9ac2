"""Pure-torch twins of the linear-attention kernels (Gated DeltaNet, as in Qwen3-Next and
Qwen3.5): causal conv1d over packed sequences with per-request state slots, the gated delta
rule (chunked for prefill, one recurrent step for decode), the gated RMSNorm and the sigmoid
output gate. They are the CPU path and the ground truth of the Triton kernels' tests.

Packed layout: the new tokens of B sequences lie back to back (T rows, `query_start_loc`
(B+1,)); `seq_lens` (B,) counts each sequence's tokens after this step, so a sequence whose
`seq_len` equals its new-token count starts fresh (zero state). `state_ids` (B,) picks each
sequence's slot in the state tensors; a negative id (padding) starts from zero and writes
nothing back. With `copies` = 2 a slot owns two rows (2·slot, 2·slot + 1) used in turn: a
step reads the row of its cached length's parity and writes the row of its new length's
parity, so a queued step that is dropped can be recomputed from the state it read."""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64  # tokens per chunk of the chunked delta rule (the kernels use the same)
L2NORM_EPS = 1e-6


def state_rows(sid: int, cached: int, seq_len: int, copies: int) -> tuple[int, int]:
    """(row read, row written) of slot `sid` for a step from `cached` to `seq_len` tokens."""
    return sid * copies + cached % copies, sid * copies + seq_len % copies


def _spans(query_start_loc, seq_lens, state_ids, copies: int):
    """(start, num_new, row read or -1 for a zero state, row written or -1) per sequence."""
    qsl, lens, ids = query_start_loc.tolist(), seq_lens.tolist(), state_ids.tolist()
    for b, sid in enumerate(ids):
        start, n = qsl[b], qsl[b + 1] - qsl[b]
        read, write = state_rows(sid, lens[b] - n, lens[b], copies)
        yield start, n, read if sid >= 0 and lens[b] - n > 0 else -1, write if sid >= 0 else -1


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    state_ids: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    copies: int = 1,
) -> torch.Tensor:
    """Depthwise causal conv + SiLU. x (T, C); weight (C, K); conv_states (S·copies, K-1, C)
    hold the K-1 inputs before each sequence's new tokens and receive its last K-1 inputs.
    Float32 arithmetic, one rounding to x's dtype: (T, C)."""
    k = weight.shape[1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    w = weight.float()
    for start, n, read, write in _spans(query_start_loc, seq_lens, state_ids, copies):
        if n == 0:
            continue
        zero = x.new_zeros(k - 1, x.shape[1]).float()
        prev = conv_states[read].float() if read >= 0 else zero
        xx = torch.cat([prev, x[start : start + n].float()])  # (K-1+n, C)
        acc = sum(xx[j : j + n] * w[:, j] for j in range(k))
        out[start : start + n] = F.silu(acc).to(x.dtype)
        if write >= 0:
            conv_states[write] = xx[-(k - 1) :].to(conv_states.dtype)
    return out


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    state_ids: torch.Tensor,
    seq_lens: torch.Tensor,
    copies: int = 1,
) -> torch.Tensor:
    """One new token per sequence: x (B, C) → (B, C); the prefill twin with B spans of one."""
    qsl = torch.arange(x.shape[0] + 1, dtype=torch.int32, device=x.device)
    return causal_conv1d_prefill(x, weight, conv_states, state_ids, qsl, seq_lens, copies)


def gate_and_beta(
    a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token and value head: the log-decay g = -exp(A_log) * softplus(a + dt_bias) and
    the write strength beta = sigmoid(b), both float32 (T, Hv)."""
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.float().sigmoid()


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _heads(q: torch.Tensor, k: torch.Tensor, num_v_heads: int) -> tuple[torch.Tensor, ...]:
    """L2-normalised float32 q (scaled by Dk^-1/2) and k, repeated to the value heads."""
    rep = num_v_heads // q.shape[1]
    q = _l2norm(q.float()) * q.shape[-1] ** -0.5
    k = _l2norm(k.float())
    return q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)


def _chunked_span(q, k, v, g, beta, state):
    """One sequence, all heads: q/k (n, H, Dk), v (n, H, Dv), g/beta (n, H), state (H, Dk, Dv)
    float32 → (out (n, H, Dv), final state). Chunks of CHUNK tokens from the span's start."""
    n = q.shape[0]
    out = v.new_empty(v.shape)
    for c0 in range(0, n, CHUNK):
        qc, kc, vc = (t[c0 : c0 + CHUNK].transpose(0, 1) for t in (q, k, v))  # (H, L, D)
        gc = g[c0 : c0 + CHUNK].t().cumsum(-1)  # (H, L) decay since the chunk start
        bc = beta[c0 : c0 + CHUNK].t()
        length = gc.shape[-1]
        lower = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        decay = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).masked_fill(~lower, float("-inf")).exp()
        strict = (kc * bc.unsqueeze(-1)) @ kc.transpose(-1, -2) * decay
        system = torch.eye(length, device=q.device) + strict.tril(-1)  # I + A, A strictly lower
        u = torch.linalg.solve_triangular(system, vc * bc.unsqueeze(-1), upper=False)
        w = torch.linalg.solve_triangular(system, kc * (bc * gc.exp()).unsqueeze(-1), upper=False)
        v_new = u - w @ state  # (H, L, Dv)
        attn = (qc @ kc.transpose(-1, -2)) * decay  # causal, diagonal included
        out[c0 : c0 + length] = ((qc * gc.exp().unsqueeze(-1)) @ state + attn @ v_new).transpose(
            0, 1
        )
        last = gc[:, -1:]  # (H, 1)
        k_tail = kc * (last - gc).exp().unsqueeze(-1)
        state = state * last.exp().unsqueeze(-1) + k_tail.transpose(-1, -2) @ v_new
    return out, state


def gated_delta_rule_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    state_ids: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    copies: int = 1,
) -> torch.Tensor:
    """The chunked gated delta rule over packed sequences. q/k (T, Hk, Dk) straight from the
    conv (L2-normalised here), v (T, Hv, Dv), a/b (T, Hv) the decay and beta projections;
    ssm_states (S·copies, Hv, Dk, Dv) float32 hold each sequence's initial state and receive
    its final one. Returns (T, Hv, Dv) in v's dtype."""
    num_v_heads = v.shape[1]
    qh, kh = _heads(q, k, num_v_heads)
    g, beta = gate_and_beta(a, b, a_log, dt_bias)
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    zero = v.new_zeros(num_v_heads, q.shape[-1], v.shape[-1], dtype=torch.float32)
    for start, n, read, write in _spans(query_start_loc, seq_lens, state_ids, copies):
        if n == 0:
            continue
        span = slice(start, start + n)
        state = ssm_states[read].float() if read >= 0 else zero
        o, state = _chunked_span(qh[span], kh[span], v[span].float(), g[span], beta[span], state)
        out[span] = o.to(v.dtype)
        if write >= 0:
            ssm_states[write] = state.to(ssm_states.dtype)
    return out


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    state_ids: torch.Tensor,
    seq_lens: torch.Tensor,
    copies: int = 1,
) -> torch.Tensor:
    """One recurrent step per sequence (row b = sequence b's new token); arguments as the
    prefill twin with T = B. S ← exp(g) S; S ← S + k ⊗ beta (v − kᵀS); out = qᵀS."""
    qh, kh = _heads(q, k, v.shape[1])  # (B, Hv, Dk)
    g, beta = gate_and_beta(a, b, a_log, dt_bias)  # (B, Hv)
    ids, lens = state_ids.long(), seq_lens.long()
    read = ids.clamp(min=0) * copies + (lens - 1) % copies
    write = ids * copies + lens % copies
    has_prev = ((ids >= 0) & (lens > 1)).view(-1, 1, 1, 1)
    state = torch.where(has_prev, ssm_states[read].float(), 0.0)  # (B, Hv, Dk, Dv)
    state = state * g.exp()[..., None, None]
    kv = (state * kh.unsqueeze(-1)).sum(-2)  # (B, Hv, Dv)
    delta = (v.float() - kv) * beta.unsqueeze(-1)
    state = state + kh.unsqueeze(-1) * delta.unsqueeze(-2)
    out = (state * qh.unsqueeze(-1)).sum(-2)
    keep = ids >= 0
    ssm_states[write[keep]] = state[keep].to(ssm_states.dtype)
    return out.to(v.dtype)


def gated_delta_rule_recurrent(q, k, v, g, beta, state):
    """The naive token-by-token rule for one sequence (tests only): q/k (n, H, Dk) already
    normalised and scaled, v (n, H, Dv), g/beta (n, H), state (H, Dk, Dv), all float32."""
    out = v.new_empty(v.shape)
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        kv = (state * k[t].unsqueeze(-1)).sum(-2)
        state = state + k[t].unsqueeze(-1) * ((v[t] - kv) * beta[t].unsqueeze(-1)).unsqueeze(-2)
        out[t] = (state * q[t].unsqueeze(-1)).sum(-2)
    return out, state


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """RMSNorm of each head row x (T, H, D) times SiLU(gate) (T, H, D), HF's numerics:
    normalise in float32, round, multiply by the weight (D,), then by SiLU(gate) in float32
    and round once. Returns (T, H*D) in x's dtype."""
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    out = (weight * normed) * F.silu(gate.float())
    return out.to(x.dtype).reshape(x.shape[0], -1)


def sigmoid_gate_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Gated attention output: x (T, H, D) * sigmoid(gate (T, H, D)), rounded as torch does
    elementwise (sigmoid, then product). Returns (T, H*D)."""
    return (x * torch.sigmoid(gate)).reshape(x.shape[0], -1)
