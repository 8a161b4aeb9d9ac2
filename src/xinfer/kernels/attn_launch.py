"""Triton launchers for RMSNorm, RoPE, KV-cache stores and paged attention: shape and dtype
checks, output allocation, grid and block sizes. `xinfer.kernels` calls these on CUDA; they
also run on CPU tensors under `TRITON_INTERPRET=1` (the interpreter tests)."""

from __future__ import annotations

import math

import torch
import triton

from xinfer.kernels import arrivals, kv_turbo_launch, pdl, reference
from xinfer.kernels.triton import attention as attn_kernels
from xinfer.kernels.triton.kv_cache import store_kv_kernel
from xinfer.kernels.triton.norm import rms_norm_kernel
from xinfer.kernels.triton.rotary import rope_kernel
from xinfer.kv.turbo import TurboKVCache

LOG2E = 1.4426950408889634
# CPU tensors (Triton's interpreter) get small tiles, so that small tests cross tile borders;
# a test sets this False to run the tiles that CUDA tensors get instead.
SMALL_INTERPRETER_TILES = True


def _pow2(n: int, floor: int = 1) -> int:
    return max(floor, triton.next_power_of_2(n))


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """(t, inner, stride0, stride1): row r of t's last dim sits at (r // inner) * stride0 +
    (r % inner) * stride1, so 2-D and 3-D strided views (q/k heads of a qkv split) need no copy."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    if t.dim() == 3:
        return t, t.shape[1], t.stride(0), t.stride(1)
    if t.dim() != 2:
        t = t.reshape(-1, t.shape[-1])
    return t, 1, t.stride(0), 0


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Out of place; with `residual` returns (normed, x + residual) like the reference."""
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"rms_norm: residual {tuple(residual.shape)} != x {tuple(x.shape)}")
    n_cols = x.shape[-1]
    x_dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x_dtype), device=x.device)
    res_out = torch.empty(x.shape, dtype=x_dtype, device=x.device) if residual is not None else out
    num_rows = x.numel() // max(n_cols, 1)
    if num_rows > 0:
        xr, inner, sx0, sx1 = _rows(x)
        rr, r_inner, sr0, sr1 = _rows(residual) if residual is not None else (xr, inner, 0, 0)
        if r_inner != inner:  # a 3-D residual view against 2-D x (or back): align layouts
            xr, inner, sx0, sx1 = _rows(x.contiguous().view(-1, n_cols))
            rr, _, sr0, sr1 = _rows(residual.contiguous().view(-1, n_cols))
        block_n = _pow2(n_cols)
        rms_norm_kernel[(num_rows,)](
            xr, rr, weight.contiguous(), out, res_out, inner, sx0, sx1, sr0, sr1, n_cols, eps,
            HAS_RESIDUAL=residual is not None, BLOCK_N=block_n,
            num_warps=max(1, min(16, block_n // 256)), **pdl.options(x),
        )  # fmt: skip
    return out if residual is None else (out, res_out)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out of place (new contiguous q, k) like the reference; q (T, Hq, D), k (T, Hk, D)."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"apply_rope: q {tuple(q.shape)} and k {tuple(k.shape)} disagree")
    if positions.shape != (q.shape[0],) or cos_sin_cache.shape[-1] != q.shape[2]:
        raise ValueError("apply_rope: positions must be (T,) and cos_sin_cache (max_pos, D)")
    if q.dtype != k.dtype or cos_sin_cache.dtype != torch.float32 or q.shape[2] % 2:
        return reference.apply_rope(q, k, positions, cos_sin_cache)
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    cos_sin_cache = cos_sin_cache.contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if q.shape[0] == 0:
        return q_out, k_out
    half = q.shape[2] // 2
    block_d = _pow2(half)
    block_h = max(1, min(_pow2(max(q.shape[1], k.shape[1])), 2048 // block_d))
    rope_kernel[(q.shape[0],)](
        q, k, q_out, k_out, positions, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), cos_sin_cache.stride(0), q.shape[1], k.shape[1], half,
        BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4,
    )  # fmt: skip
    return q_out, k_out


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """In place into the caches; slots < 0 are skipped."""
    if k.dim() != 3 or k.shape != v.shape or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"store_kv: k/v {tuple(k.shape)} or caches {tuple(k_cache.shape)} bad")
    if k.shape[1:] != k_cache.shape[2:] or slot_mapping.shape != (k.shape[0],):
        raise ValueError("store_kv: k (T, Hk, D), caches (blocks, block_size, Hk, D), slots (T,)")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("store_kv: the KV caches must be contiguous in head_dim")
    if k.shape[0] == 0:
        return
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    num_heads, head_dim = k.shape[1], k.shape[2]
    store_kv_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], num_heads, head_dim, k_cache.shape[1],
        BLOCK_H=_pow2(num_heads), BLOCK_D=_pow2(head_dim), num_warps=4,
        FP8_MAX=float(torch.finfo(k_cache.dtype).max) if k_cache.element_size() == 1 else 0.0,
    )  # fmt: skip


# Decode launch configs on CUDA, by the host-side bound max_seq_len: rows by increasing bound,
# the first that covers it (the last row also takes every larger bound). SPLIT_LEN keys per
# split, a multiple of BLOCK_N: the grid has cdiv(bound, SPLIT_LEN) splits, so a smaller
# SPLIT_LEN spreads a short context over more programs but writes more partial outputs
# (GROUP * D values per split of a KV head). BLOCK_N keys per tile. Set for bf16/fp16 with
# head_dim <= 128 (wider rows: see `decode_config`). A row changes result bits (the split
# ranges), never their independence of the batch. Tune on the GPU with
# `python bench/bench_attention_kernel.py --sweep`: it prints the best row per bound.
# Rows from that sweep on the H200 (2026-12-02; geometric mean over batch 1/8/32 and
# contexts 128..bound, within 1.09x of each case's best).
DECODE_CONFIGS: tuple[tuple[int, dict[str, int]], ...] = (
    (4096, dict(SPLIT_LEN=64, BLOCK_N=32, num_warps=4, num_stages=3)),
    (8192, dict(SPLIT_LEN=128, BLOCK_N=32, num_warps=4, num_stages=3)),
)
# TurboQuant caches: the loader's centroid lookup by warp shuffles from a table in registers
# (True) or by a load of the cached table a coordinate (False). Offline SASS (thirtieth
# session): 2,313 against 2,471 instructions a decode loop; not yet timed, so off
# (`bench/bench_kv_turbo.py --variants` times both). Either has the same values.
TURBO_LOOKUP_SHUFFLE = False
# TurboQuant caches' decode launch config, where not None: replaces DECODE_CONFIGS' row
# (its keys: SPLIT_LEN, BLOCK_N, num_warps, num_stages). The turbo loop is latency-bound
# (39 µs at 8k against a 9.7 µs issue floor, H100); this is the knob to time.
TURBO_DECODE_CONFIG: dict[str, int] | None = None
# Splits merged per step of the decode merge. Fixed: the merge's summation order (so the
# bits) then depends on the launch config row (split length, warps) only, not on the number
# of splits.
REDUCE_BLOCK_S = 64
# True: decode attention's splits are merged by each (sequence, KV head)'s last split to
# arrive (one launch fewer an attention layer, the same bits as apart; `arrivals`). False,
# or no counters (a CUDA graph captured before any were made): `reduce_splits`, a launch of
# its own. Off until a GPU has run tests/kernels/test_decode_reduce_fused_gpu.py (memory
# ordering and the merge's order as compiled; the interpreter shows the same bits) and timed
# it (bench/NOTES.md, twenty-seventh session).
FUSED_DECODE_REDUCE = False


def decode_config(q: torch.Tensor, head_dim: int, max_seq_len: int) -> dict[str, int]:
    """The DECODE_CONFIGS row for the bound `max_seq_len` (host-side, so a graph stays valid)."""
    rows = (c for bound, c in DECODE_CONFIGS if max_seq_len <= bound)
    cfg = dict(next(rows, DECODE_CONFIGS[-1][1]))
    if not q.is_cuda and SMALL_INTERPRETER_TILES:
        cfg.update(BLOCK_N=16, num_stages=1)
    elif q.element_size() * _pow2(head_dim) > 256:  # fp32 or head_dim > 128: no spills on sm_90
        cfg.update(BLOCK_N=max(16, cfg["BLOCK_N"] // 2), num_warps=max(8, cfg["num_warps"]))
    return cfg


def prefill_config(q: torch.Tensor) -> dict[str, int]:
    """Tile sizes; sm_90 bf16 choices stay under 255 registers without spills."""
    if not q.is_cuda and SMALL_INTERPRETER_TILES:
        return dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
    if q.dtype == torch.float32:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    if q.shape[-1] > 128:  # wide heads (Gemma 3, Qwen3.5 full attention): unswept
        return dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2)
    # the best of eleven tiles on the H200 (bench_attention_kernel.py --sweep-prefill,
    # 2026-12-04, head_dim 128, GQA 4): 2k new tokens 258 -> 199 µs fresh and
    # 5,509 -> 3,074 µs after 30k cached, against (128, 32, 8 warps)
    return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)


def decode_num_splits(max_seq_len: int, split_len: int) -> int:
    """Splits that cover `max_seq_len` keys (a host-side bound, so a captured graph stays
    valid); the merge reads only the splits a sequence reaches."""
    return max(1, math.ceil(max_seq_len / split_len))


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    split_len: int | None = None,
    config: dict[str, int] | None = None,
    sliding_window: int | None = None,
    turbo: TurboKVCache | None = None,
) -> torch.Tensor:
    """Decode kernel when every sequence has exactly one query (max_query_len == 1 and
    T == B; query_start_loc is then taken to be arange(B+1)), else the prefill kernel.
    Without the host-side bounds this reads them from the device (not graph-capturable).
    `config` overrides entries of the launch config (decode: `decode_config`, prefill:
    `prefill_config`); `split_len` overrides the decode SPLIT_LEN (rounded up to whole tiles).
    `sliding_window` W: a query at position p sees keys (p - W, p] only. `turbo`: a
    TurboQuant cache whose codes are k_cache/v_cache (q and the output are in its rotated
    space: `kernels/kv_turbo.py` rotates)."""
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"paged_attention: q {tuple(q.shape)}, cache {tuple(k_cache.shape)}")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    row_width = head_dim
    if (k_cache.dtype == torch.uint8) != (turbo is not None):
        raise ValueError("paged_attention: uint8 caches are TurboQuant codes, given with `turbo`")
    if turbo is not None:
        kv_turbo_launch.check_cache(turbo)
        if k_cache is not turbo.k_codes or v_cache is not turbo.v_codes:
            raise ValueError("paged_attention: with `turbo`, the caches are its codes")
        row_width = turbo.bits * head_dim // 8
    if k_cache.shape[3] != row_width or num_heads % num_kv_heads:
        raise ValueError(f"paged_attention: {num_heads} q heads vs {num_kv_heads} KV heads")
    num_seqs = seq_lens.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError("paged_attention: block_tables must be (B, max_blocks)")
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError("paged_attention: query_start_loc must be (B+1,)")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("paged_attention: the KV caches must be contiguous in head_dim")
    q = q if q.stride(-1) == 1 else q.contiguous()
    block_tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    if num_tokens == 0 or num_seqs == 0:
        return torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"paged_attention: sliding_window {sliding_window} must be >= 1")
    # the kernels' leading arguments: q, caches, turbo scales and codebook, tables, lengths
    scales = (turbo.k_scales, turbo.v_scales, turbo.centroids) if turbo else (seq_lens,) * 3
    paged = (q, k_cache, v_cache, *scales, block_tables, seq_lens)
    window = dict(window=sliding_window or 0, HAS_WINDOW=sliding_window is not None)
    if max_query_len == 1 and num_tokens == num_seqs:
        turbo_cfg = TURBO_DECODE_CONFIG if turbo is not None and q.is_cuda else None
        cfg = {**decode_config(q, head_dim, max_seq_len), **(turbo_cfg or {}), **(config or {})}
        if split_len:
            cfg["SPLIT_LEN"] = split_len
        return _decode(paged, scale, max_seq_len, cfg, window)
    cfg = {**prefill_config(q), **(config or {})}
    return _prefill(paged, query_start_loc, scale, max_query_len, cfg, window)


def _common_args(paged: tuple, out: torch.Tensor) -> tuple[tuple[int, ...], dict]:
    """Strides (q, K, V, block table, out) and the constexprs both attention kernels take."""
    q, k_cache, v_cache, block_tables = paged[0], paged[1], paged[2], paged[-2]
    strides = (q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3])
    strides += (block_tables.stride(0), out.stride(0), out.stride(1))
    head_dim, group = q.shape[2], q.shape[1] // k_cache.shape[2]
    # uint8 caches are TurboQuant codes: bits * head_dim / 8 bytes a row
    turbo_bits = k_cache.shape[3] * 8 // head_dim if k_cache.dtype == torch.uint8 else 0
    constexprs = dict(
        HEAD_DIM=head_dim, KV_BLOCK_SIZE=k_cache.shape[1], GROUP=group,
        BLOCK_D=_pow2(head_dim, 16), DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        TURBO_BITS=turbo_bits, TURBO_SHUFFLE=bool(turbo_bits) and TURBO_LOOKUP_SHUFFLE,
    )  # fmt: skip
    return strides, constexprs


def _decode(paged: tuple, scale: float, max_seq_len: int, cfg: dict, window: dict) -> torch.Tensor:
    """Split (flash-decoding) then merge, always (even for one split), so that a sequence's
    bits depend only on the split length, not on the bound, the batch or the other rows. The
    merge runs in the decode launch's last split of each (sequence, KV head) when
    FUSED_DECODE_REDUCE is on and `arrivals` gives counters, else in `reduce_splits`."""
    q, k_cache, block_tables, seq_lens = paged[0], paged[1], paged[-2], paged[-1]
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    strides, constexprs = _common_args(paged, out)
    block_n = cfg.pop("BLOCK_N")
    split_len = -(-cfg.pop("SPLIT_LEN") // block_n) * block_n  # whole tiles
    splits = decode_num_splits(max_seq_len, split_len)
    part_out = q.new_empty((num_seqs, num_heads, splits, head_dim))
    part_lse = q.new_empty((num_seqs, num_heads, splits), dtype=torch.float32)
    groups = num_seqs * num_kv_heads
    counters = arrivals.counters(q.device, groups) if FUSED_DECODE_REDUCE else None
    attn_kernels.decode_kernel[(num_seqs, num_kv_heads, splits)](
        *paged, part_out, part_lse, out, seq_lens if counters is None else counters,
        scale * LOG2E, splits, split_len, block_tables.shape[1], window["window"], *strides,
        BLOCK_G=_pow2(constexprs["GROUP"], 16), BLOCK_N=block_n, BLOCK_S=REDUCE_BLOCK_S,
        HAS_WINDOW=window["HAS_WINDOW"], REDUCE=counters is not None, **constexprs, **cfg,
        **pdl.options(q),
    )  # fmt: skip
    if counters is None:
        reduce_splits(part_out, part_lse, seq_lens, out, split_len, window, cfg.get("num_warps", 4))
    return out


def reduce_splits(
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    split_len: int,
    window: dict,
    num_warps: int,
) -> None:
    """The decode merge as a launch of its own (`decode_reduce_kernel`), with the decode
    launch's warps: the fused merge's layouts, so its reductions' order and bits."""
    num_seqs, num_heads, splits, head_dim = part_out.shape
    attn_kernels.decode_reduce_kernel[(num_seqs, num_heads)](
        part_out, part_lse, seq_lens, out, splits, split_len, window["window"], out.stride(0),
        out.stride(1), HEAD_DIM=head_dim, BLOCK_S=REDUCE_BLOCK_S, BLOCK_D=_pow2(head_dim, 16),
        HAS_WINDOW=window["HAS_WINDOW"], num_warps=num_warps, **pdl.options(out),
    )  # fmt: skip


def _prefill(
    paged: tuple,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int,
    cfg: dict,
    window: dict,
) -> torch.Tensor:
    """Flash-attention tiles of BLOCK_Q tokens x GROUP heads, causal over the cached keys."""
    q, k_cache, seq_lens = paged[0], paged[1], paged[-1]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    strides, constexprs = _common_args(paged, out)
    cfg["BLOCK_M"] = max(cfg["BLOCK_M"], _pow2(constexprs["GROUP"]))
    cfg["BLOCK_Q"] = cfg["BLOCK_M"] // constexprs["GROUP"]
    grid = (triton.cdiv(max_query_len, cfg["BLOCK_Q"]), seq_lens.shape[0], k_cache.shape[2])
    attn_kernels.prefill_kernel[grid](
        *paged, query_start_loc, out, scale * LOG2E, window["window"], *strides,
        HAS_WINDOW=window["HAS_WINDOW"], **constexprs, **cfg,
    )  # fmt: skip
    return out
