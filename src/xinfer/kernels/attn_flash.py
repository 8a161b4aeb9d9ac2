"""Long-prompt attention on torch's flash attention (FA2), an alternative to the Triton
prefill kernel chosen with `XINFER_PREFILL_ATTENTION=flash` (default `triton`).

It serves one case only, the one that dominates a long prompt's time to first token: a step
of one sequence (each chunk of a prompt pass is one) with many new tokens, on CUDA, K/V cached
in the activations' dtype, no sliding window. The sequence's cached K/V are gathered from
their blocks into contiguous tensors (~60 MB a layer for 30k cached tokens: tens of µs
beside milliseconds of attention), then FA2 runs twice — the new tokens against the cached
prefix with no mask, and against themselves with the causal mask (a square, so FA2's
top-left and bottom-right alignments agree) — and the two results are merged by their
log-sum-exps in float32. Grouped-query attention is FA2's own (fewer K/V heads than query
heads). Everything else takes the Triton kernel, so the choice depends only on host-known
sizes: a sequence's bits do not depend on what else is batched, and a prompt pass computes
the same bits as the chunks run one by one."""

from __future__ import annotations

import torch

from xinfer import envs

MIN_QUERY = 1024  # fewer new tokens: the Triton kernel (FA2's two calls and merge cost more)
_DTYPES = (torch.bfloat16, torch.float16)


def wanted(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_tables: torch.Tensor,
    max_query_len: int | None,
    max_seq_len: int | None,
    sliding_window: int | None,
) -> bool:
    """Whether this call takes FA2: a case it serves (see the module), and chosen. The sizes
    come first: decode steps (one query a sequence) stop there, before the switch is read."""
    return (
        max_query_len is not None
        and max_query_len == q.shape[0] >= MIN_QUERY
        and block_tables.shape[0] == 1
        and max_seq_len is not None
        and envs.XINFER_PREFILL_ATTENTION() == "flash"
        and q.is_cuda
        and q.dtype in _DTYPES
        and k_cache.dtype == q.dtype
        and sliding_window is None
        and q.shape[-1] % 8 == 0
        and q.shape[-1] <= 256
        and torch.cuda.get_device_capability(q.device) >= (8, 0)
    )


def flash_forward():
    """torch's FA2 forward (returns the log-sum-exp beside the output)."""
    return torch.ops.aten._scaled_dot_product_flash_attention


def merge(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """Attention over two disjoint key sets from each one's output (..., L, D) and natural
    log-sum-exp (..., L): the softmax-weighted mean of the two, in float32."""
    m = torch.maximum(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - m)[..., None], torch.exp(lse_b - m)[..., None]
    return (out_a.float() * w_a + out_b.float() * w_b) / (w_a + w_b)


def prefill_one_sequence(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    """q (L, Hq, D): the sequence's L newest tokens, whose K/V (with every earlier token's)
    are in the caches (blocks, block_size, Hk, D) through `table` (max_blocks,) → (L, Hq, D)."""
    new = q.shape[0]
    block_size = k_cache.shape[1]
    blocks = table[: -(-seq_len // block_size)].long()

    def gather(cache: torch.Tensor) -> torch.Tensor:  # → (1, Hk, S, D)
        return cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0)

    k, v = gather(k_cache), gather(v_cache)
    qh = q.transpose(0, 1).unsqueeze(0)  # (1, Hq, L, D)
    flash = flash_forward()
    tail = slice(seq_len - new, seq_len)
    out, lse = flash(qh, k[:, :, tail], v[:, :, tail], 0.0, True, scale=scale)[:2]
    if seq_len > new:
        head = slice(0, seq_len - new)
        out_p, lse_p = flash(qh, k[:, :, head], v[:, :, head], 0.0, False, scale=scale)[:2]
        out = merge(out, lse, out_p, lse_p)
    return out[0].transpose(0, 1).to(q.dtype).contiguous()
