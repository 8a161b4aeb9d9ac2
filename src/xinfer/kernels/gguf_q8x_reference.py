"""Pure-torch twins of the GGUF decode GEMVs on int8 activations (`triton/gguf_q8x.py`): the
per-32 quantization of activations (bit for bit: the same IEEE divisions, multiplies and
round-half-even), and the Q4_K / Q8_0 / Q6_K linear and routed-expert MLP computed from
it — the integer sums exact, the float work per group of weights in float32."""

from __future__ import annotations

import torch

from xinfer.quant.gguf_blocks import q4_k_parts, q6_k_parts


def quantize_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (M, K), K a multiple of 32 → (codes (M, K) int32 in [-127, 127], d (M, K/32),
    d·Σcodes (M, K/32) float32): d = amax / 127 a block, codes = round-half-even(x · (1/d))
    (each operation rounded to float32 once, as the kernel's div_rn and mul.rn)."""
    m, k = x.shape
    v = x.float().reshape(m, k // 32, 32)
    d = v.abs().amax(dim=-1) / 127.0
    live = d > 0
    inv = torch.where(live, 1.0 / torch.where(live, d, 1.0), 0.0)
    q = torch.round(v * inv[..., None]).to(torch.int32)
    return q.reshape(m, k), d, d * q.sum(dim=-1).float()


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`quantize_blocks`'s outputs for whole rows: (words (M, K/4) int32, the codes four a
    word lowest byte first; d (M, K/32); d·Σcodes (M, K/32))."""
    q, d, s = quantize_codes(x)
    m, k = q.shape
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int64, device=x.device)
    words = ((q.to(torch.int64) & 255).reshape(m, k // 4, 4) << shifts).sum(dim=-1)
    words = torch.where(words >= 1 << 31, words - (1 << 32), words)  # two's complement
    return words.to(torch.int32), d, s


def _rows(raw: torch.Tensor, k: int, btype: str) -> tuple[torch.Tensor, ...]:
    """Rows of Q4_K, Q8_0 or Q6_K blocks (N, row bytes) → (codes (N, K/g, g) int32, the scale
    and the minimum of each group of g weights (N, K/g) float32: weight = scale·code −
    minimum), g = 32 (16 for Q6_K, whose scales are per 16)."""
    n = raw.shape[0]
    if btype == "Q4_K":
        d, dmin, sc, mn, codes = q4_k_parts(raw.reshape(n * (k // 256), 144))
        scale = (d[:, None] * sc.float()).reshape(n, k // 32)
        minimum = (dmin[:, None] * mn.float()).reshape(n, k // 32)
        return codes.to(torch.int32).reshape(n, k // 32, 32), scale, minimum
    if btype == "Q6_K":
        d, scales, codes = q6_k_parts(raw.reshape(n * (k // 256), 210))
        scale = (d[:, None] * scales.float()).reshape(n, k // 16)
        return codes.to(torch.int32).reshape(n, k // 16, 16), scale, torch.zeros_like(scale)
    if btype != "Q8_0":
        raise ValueError(f"q8x twin: {btype} is not Q4_K, Q8_0 or Q6_K")
    blocks = raw.reshape(n * (k // 32), 34)
    d = blocks[:, :2].contiguous().view(torch.float16).float().reshape(n, k // 32)
    codes = blocks[:, 2:].contiguous().view(torch.int8).to(torch.int32)
    return codes.reshape(n, k // 32, 32), d, torch.zeros_like(d)


def dot(raw: torch.Tensor, x: torch.Tensor, btype: str) -> torch.Tensor:
    """(M, N) float32: rows of x (M, K) against the rows raw (N, row bytes) of `btype` as
    the kernels compute them: Σ_g scale[g]·(dx[g]·Σ code·xq) − minimum[g]·(dx[g]·Σ xq) over
    the groups of g weights (dx: the scale of the block of 32 a group lies in)."""
    k = x.shape[1]
    codes, scale, minimum = _rows(raw, k, btype)
    g = codes.shape[-1]
    q, dx, sx = quantize_codes(x)
    xq = q.reshape(q.shape[0], k // g, g)
    dx, sx = dx.repeat_interleave(32 // g, dim=1), sx.repeat_interleave(32 // g, dim=1)
    isum = torch.einsum("nsl,msl->mns", codes.to(torch.int64), xq.to(torch.int64)).float()
    part = scale[None] * (dx[:, None, :] * isum) - minimum[None] * sx[:, None, :]
    return part.sum(dim=-1)


def linear(
    x: torch.Tensor, raw: torch.Tensor, btype: str, bias: torch.Tensor | None
) -> torch.Tensor:
    """The decode linear: x (M, K) @ W^T (+ bias) in x's dtype, W the rows raw."""
    y = dot(raw, x, btype)
    return (y if bias is None else y + bias.float()).to(x.dtype)


def moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    btype13: str,
    w2: torch.Tensor,
    btype2: str,
    inter: int,
) -> torch.Tensor:
    """The routed experts (T, H) in hidden's dtype: per pair, gate and up from the quantized
    hidden row, h = silu(gate)·up in float32, quantized again for the down rows; each pair's
    output rounded to the dtype, then summed in k order in float32 with the route weights."""
    num_tokens, top_k = topk_ids.shape
    out = torch.zeros(num_tokens, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    for t in range(num_tokens):
        for j in range(top_k):
            e = int(topk_ids[t, j])
            gu = dot(w13[e], hidden[t : t + 1], btype13)[0]
            g, u = gu[:inter], gu[inter:]
            h = g / (1.0 + torch.exp(-g)) * u
            y = dot(w2[e], h[None], btype2)[0].to(hidden.dtype)
            out[t] += y.float() * topk_weights[t, j].float()
    return out.to(hidden.dtype)
