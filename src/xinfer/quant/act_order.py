"""Act-order (GPTQ `desc_act`, compressed-tensors `actorder: group`) int4 weights: input channel
k belongs to scale group g_idx[k], and a group's channels need not be contiguous in k. At load
the codes are sorted by group (perm = stable argsort(g_idx): column j of the engine's weight is
input channel perm[j]), which makes them an ordinary grouped int4 weight W_p; the kernels load
x through `perm` (W x = W_p x[perm]). A routed expert's down projection needs no runtime
gather: its perm is folded into the rows of the expert's gate and up (`fold_down_perm`), so
the intermediate activations come out in w2's sorted order."""

from __future__ import annotations

import torch

from xinfer.errors import UserError
from xinfer.quant.checks import cdiv
from xinfer.quant.packing import pack_nibbles, unpack_nibbles


def perm_dtype(k: int) -> torch.dtype:
    """int16 where every channel index fits (half the bytes a kernel reads beside x), else int32."""
    return torch.int16 if k <= 1 << 15 else torch.int32


def perm_from_g_idx(g_idx: torch.Tensor, k: int, group: int, producer: str) -> torch.Tensor:
    """g_idx (K,) → perm (K,) in `perm_dtype(k)`: the channels of group 0, then group 1, ...
    each in increasing k. Refuses a g_idx whose groups do not each hold `group` channels (the
    last one the rest), which the sorted layout's one scale per `group` columns cannot hold."""
    g = g_idx.long()
    groups = cdiv(k, group)
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= groups):
        raise UserError(
            f"{producer} g_idx names scale groups outside 0..{groups - 1}; the checkpoint's "
            f"group_size ({group}) does not match its g_idx"
        )
    counts = torch.bincount(g, minlength=groups)
    expected = torch.bincount(torch.arange(k, device=g.device) // group, minlength=groups)
    if not torch.equal(counts, expected):
        bad = int(torch.nonzero(counts != expected)[0])
        raise UserError(
            f"{producer} g_idx puts {int(counts[bad])} input channels in scale group {bad} "
            f"where group_size is {group}; xinfer reads act-order checkpoints whose groups each "
            f"hold group_size channels"
        )
    return torch.argsort(g, stable=True).to(perm_dtype(k))


def check_perm(perm: torch.Tensor, k: int) -> None:
    """Refuse a perm that is not a permutation of 0..K-1 (no g_idx was loaded into it)."""
    seen = torch.zeros(k, dtype=torch.int32, device=perm.device)
    seen.index_add_(0, perm.long().clamp(0, k - 1), torch.ones_like(perm, dtype=torch.int32))
    if not bool((seen == 1).all()):
        raise ValueError("act-order weight: perm is not a permutation of its input channels")


def sort_columns(qweight: torch.Tensor, perm: torch.Tensor) -> None:
    """qweight (N, K/2) packed codes in input-channel order → column j = channel perm[j], in
    place."""
    codes = unpack_nibbles(qweight)  # (N, K)
    qweight.copy_(pack_nibbles(codes.index_select(1, perm.long())))


def unsort_columns(w: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """The inverse of the load's sort on a dense (N, K) weight: out[:, perm[j]] = w[:, j]."""
    out = torch.empty_like(w)
    out[:, perm.long()] = w
    return out


def fold_down_perm(w13: dict[str, torch.Tensor], w2_perm: torch.Tensor, inter: int) -> None:
    """One expert's gate|up set (2I rows): the rows of gate and of up each reordered by the
    down projection's perm (rows j and I + j ← perm[j] and I + perm[j]), with their scales and
    zeros, in place: silu(gate x) * (up x) then comes out as inter[perm], the order of w2's
    sorted columns."""
    p = w2_perm.long()
    rows = torch.cat([p, p + inter])
    for name in ("qweight", "scales", "zeros"):
        if name in w13:
            w13[name].copy_(w13[name].index_select(0, rows))


def quantize_in_order(fmt, weight: torch.Tensor, perm: torch.Tensor | None):
    """Round-to-nearest as an act-order quantizer lays it out: the columns taken in `perm`'s
    order (None: as they lie), group j // g of that order, → (codes (N, K) uint8 in input-channel
    order, scales (N, K/g), zero codes (N, K/g), g_idx (K,) int32) from `fmt.quantize_codes`."""
    n, k = weight.shape
    order = torch.arange(k, device=weight.device) if perm is None else perm.long()
    codes_sorted, scale, zero = fmt.quantize_codes(weight[:, order])
    codes = torch.empty_like(codes_sorted)
    codes[:, order] = codes_sorted
    g_idx = torch.empty(k, dtype=torch.int32, device=weight.device)
    g_idx[order] = (torch.arange(k, device=weight.device) // fmt.group(k)).to(torch.int32)
    return codes, scale, zero, g_idx
