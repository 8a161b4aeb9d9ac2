"""Quantizers for the GGUF block types, in torch (so they run on the GPU for `--isq`): float
rows (..., K) → the blocks' bytes (..., K / block_size * type_size) uint8, as `gguf_blocks`
reads them. Q8_0, Q4_0 and Q5_0 do the gguf package's float32 operations in its order
(equal bytes, tested); the K-quants follow llama.cpp's reference quantizers
(`quantize_row_q{4,5,6}_K_ref`: a weighted search for each sub-block's scale and min, then
6- or 8-bit sub-block scales under one float16 super-block scale)."""

from __future__ import annotations

import torch

from xinfer.quant.gguf_blocks import QK_K, block_type


def _f16_bytes(d: torch.Tensor) -> torch.Tensor:
    """(n, 1) float32 → (n, 2) uint8 of its float16."""
    return d.to(torch.float16).view(torch.uint8).reshape(d.shape[0], 2)


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """C's roundf (half away from zero), as the gguf package computes it."""
    a = x.abs()
    floored = a.floor()
    return x.sign() * (floored + (2 * (a - floored)).floor())


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """(n, 2, w) values < 16 → (n, w) bytes: the first half in the low nibbles."""
    return q[:, 0] | (q[:, 1] << 4)


def _q8_0(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().amax(dim=1, keepdim=True) / 127
    qs = _roundf(x * _inverse(d)).to(torch.int8).view(torch.uint8)
    return torch.cat([_f16_bytes(d), qs], dim=1)


def _signed_max(x: torch.Tensor) -> torch.Tensor:
    """The value of largest magnitude of each row (the first one on ties), (n, 1)."""
    return torch.gather(x, 1, x.abs().argmax(dim=1, keepdim=True))


def _q4_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_max(x) / -8
    q = torch.trunc(x * _inverse(d) + 8.5).to(torch.uint8).clamp(0, 15)
    return torch.cat([_f16_bytes(d), _pack_nibbles(q.view(-1, 2, 16))], dim=1)


def _q5_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_max(x) / -16
    q = torch.trunc(x * _inverse(d) + 16.5).to(torch.uint8).clamp(0, 31)
    qs = _pack_nibbles(q.view(-1, 2, 16) & 0x0F)
    bits = (q >> 4).view(-1, 4, 8).to(torch.int32)  # bit i of the little-endian u32
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.int32, device=x.device)
    qh = (bits * weights).sum(-1).to(torch.uint8)
    return torch.cat([_f16_bytes(d), qh, qs], dim=1)


def _qkx2(
    x: torch.Tensor, w: torch.Tensor, nmax: int, rmin: float, rdelta: float, nstep: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's make_qkx2_quants over rows of sub-blocks x (n, 32) with weights w:
    (scale, min) (n,) such that x ≈ scale * L - min, L in [0, nmax]. Like the C loop, each
    candidate scale is tried against the best min found so far."""
    lo = x.amin(1).clamp(max=0)
    hi = x.amax(1)
    flat = hi == lo
    sum_w, sum_x = w.sum(1), (w * x).sum(1)

    def levels(iscale: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
        return torch.round(iscale[:, None] * (x - mn[:, None])).clamp(0, nmax)

    def span(mn: torch.Tensor) -> torch.Tensor:
        return torch.where(flat, torch.ones_like(hi), hi - mn)

    iscale = nmax / span(lo)
    scale, mn = 1 / iscale, lo
    err = (w * (scale[:, None] * levels(iscale, lo) + lo[:, None] - x) ** 2).sum(1)
    for step in range(nstep + 1):
        lv = levels((rmin + rdelta * step + nmax) / span(mn), mn)
        sum_l, sum_l2, sum_xl = (w * lv).sum(1), (w * lv * lv).sum(1), (w * lv * x).sum(1)
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = det > 0
        safe = torch.where(ok, det, torch.ones_like(det))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / safe
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / safe
        pos = this_min > 0
        this_scale = torch.where(pos, sum_xl / sum_l2.clamp(min=1e-30), this_scale)
        this_min = torch.where(pos, torch.zeros_like(this_min), this_min)
        this_err = (w * (this_scale[:, None] * lv + this_min[:, None] - x) ** 2).sum(1)
        better = ok & (this_err < err)
        err = torch.where(better, this_err, err)
        scale = torch.where(better, this_scale, scale)
        mn = torch.where(better, this_min, mn)
    scale = torch.where(flat, torch.zeros_like(scale), scale)
    return scale, torch.where(flat, -lo, -mn)


def _k_scales_bytes(ls: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    """8 six-bit scales and mins (n, 8) → the 12 packed bytes of Q4_K / Q5_K."""
    out = torch.empty(ls.shape[0], 12, dtype=torch.uint8, device=ls.device)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)
    return out


def _k_levels(x: torch.Tensor, nmax: int, rmin: float, nstep: int):
    """Q4_K / Q5_K of super-blocks x (n, 256): (d, dmin, packed scales, levels (n, 8, 32))."""
    n = x.shape[0]
    sub = x.view(n * 8, 32)
    av_x = (sub.pow(2).sum(1, keepdim=True) / 32).sqrt()
    scales, mins = _qkx2(sub, av_x + sub.abs(), nmax, rmin, 0.1, nstep)
    scales, mins = scales.view(n, 8), mins.view(n, 8)
    max_scale, max_min = scales.amax(1, keepdim=True), mins.amax(1, keepdim=True)
    inv_scale = torch.where(max_scale > 0, 63 / max_scale, torch.zeros_like(max_scale))
    inv_min = torch.where(max_min > 0, 63 / max_min, torch.zeros_like(max_min))
    ls = torch.round(inv_scale * scales).clamp(max=63).to(torch.uint8)
    lm = torch.round(inv_min * mins).clamp(max=63).to(torch.uint8)
    d16, dmin16 = (max_scale / 63).to(torch.float16), (max_min / 63).to(torch.float16)
    d = d16.float() * ls.float()  # (n, 8) the scales as the dequantizer sees them
    dm = dmin16.float() * lm.float()
    safe = torch.where(d == 0, torch.ones_like(d), d)
    lv = torch.round((x.view(n, 8, 32) + dm[..., None]) / safe[..., None]).clamp(0, nmax)
    lv = torch.where(d[..., None] == 0, torch.zeros_like(lv), lv).to(torch.uint8)
    head = torch.cat([d16.view(torch.uint8), dmin16.view(torch.uint8), _k_scales_bytes(ls, lm)], 1)
    return head, lv


def _q4_k(x: torch.Tensor) -> torch.Tensor:
    head, lv = _k_levels(x, 15, -1.0, 20)
    qs = _pack_nibbles(lv.view(-1, 4, 2, 32).flatten(0, 1)).view(x.shape[0], 128)
    return torch.cat([head, qs], dim=1)


def _q5_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    head, lv = _k_levels(x, 31, -0.5, 15)
    qs = _pack_nibbles((lv & 0x0F).view(-1, 4, 2, 32).flatten(0, 1)).view(n, 128)
    # bit j of qh[l] is the fifth bit of element l of sub-block j
    bits = (lv >> 4).to(torch.int32)  # (n, 8, 32)
    shifts = torch.tensor([1 << j for j in range(8)], dtype=torch.int32, device=x.device)
    qh = (bits * shifts.view(1, 8, 1)).sum(1).to(torch.uint8)
    return torch.cat([head, qh, qs], dim=1)


def _qx(x: torch.Tensor, nmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's make_qx_quants(rmse_type=1) over rows x (n, 16): (scale (n,), levels)."""
    amax_idx = x.abs().argmax(1, keepdim=True)
    mx = torch.gather(x, 1, amax_idx).squeeze(1)
    tiny = x.abs().amax(1) < 1e-15
    mx = torch.where(tiny, torch.ones_like(mx), mx)
    w = x * x

    def attempt(iscale: torch.Tensor):
        lv = torch.round(iscale[:, None] * x).clamp(-nmax, nmax - 1)
        return lv, (w * x * lv).sum(1), (w * lv * lv).sum(1)

    lv, sumlx, suml2 = attempt(-nmax / mx)
    scale = torch.where(suml2 > 0, sumlx / suml2.clamp(min=1e-30), torch.zeros_like(sumlx))
    best = scale * sumlx
    for step in [s for s in range(-9, 10) if s]:
        cand, sumlx, suml2 = attempt(-(nmax + 0.1 * step) / mx)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        lv = torch.where(better[:, None], cand, lv)
        scale = torch.where(better, sumlx / suml2.clamp(min=1e-30), scale)
        best = torch.where(better, scale * sumlx, best)
    return torch.where(tiny, torch.zeros_like(scale), scale), lv


def _q6_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    scales, _ = _qx(x.view(n * 16, 16), 32)
    scales = scales.view(n, 16)
    idx = scales.abs().argmax(1, keepdim=True)
    max_scale = torch.gather(scales, 1, idx)  # (n, 1) signed
    empty = max_scale.abs() < 1e-15
    iscale = torch.where(empty, torch.zeros_like(max_scale), -128 / max_scale)
    d16 = torch.where(empty, torch.zeros_like(iscale), 1 / iscale).to(torch.float16)
    sc = torch.round(iscale * scales).clamp(max=127).to(torch.int8)
    d = d16.float() * sc.float()  # (n, 16)
    safe = torch.where(d == 0, torch.ones_like(d), d)
    lv = torch.round(x.view(n, 16, 16) / safe[..., None]).clamp(-32, 31) + 32
    lv = torch.where(d[..., None] == 0, torch.full_like(lv, 32), lv).to(torch.uint8)
    lv = lv.view(n, 2, 4, 32)  # (half, quarter, l): element half*128 + quarter*32 + l
    low = lv & 0x0F
    ql = torch.stack([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], 2)
    hi = lv >> 4
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    ql, qh = ql.reshape(n, 128), qh.reshape(n, 64)
    return torch.cat([ql, qh, sc.view(torch.uint8), d16.view(torch.uint8)], dim=1)


_QUANTIZERS = {
    "Q8_0": _q8_0,
    "Q4_0": _q4_0,
    "Q5_0": _q5_0,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}


def quantizable_types() -> list[str]:
    return sorted(_QUANTIZERS)


@torch.no_grad()
def quantize(weight: torch.Tensor, type_name: str) -> torch.Tensor:
    """Float rows (..., K) → (..., K / block_size * type_size) uint8 blocks of `type_name`,
    computed on `weight`'s device in float32."""
    bt = block_type(type_name)
    if bt.name not in _QUANTIZERS:
        raise ValueError(f"no quantizer for GGUF type {bt.name}")
    row_len = weight.shape[-1]
    row_bytes = bt.row_bytes(row_len)  # checks the block multiple
    lead = weight.shape[:-1]
    blocks = weight.float().reshape(-1, bt.block_size)
    if bt.block_size == QK_K:
        blocks = blocks.contiguous()
    out = _QUANTIZERS[bt.name](blocks)
    return out.reshape(*lead, row_bytes)
