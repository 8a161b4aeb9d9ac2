"""Launcher of the Triton skinny GEMM (`triton/gemv.py`): `linear` for decode-sized batches
(at most MAX_M = 16 rows), its config table, and `wants`, the rule by which
`xinfer.kernels.linear` takes this path instead of cuBLAS. No host sync: safe in CUDA graphs.

Batch invariance: the config depends on (N, K) and the M bucket only, and the buckets of one
(N, K) agree on cuBLAS vs Triton and on split_k (checked at import), so a row's bits are the
same for every M <= 16: the kernel always computes a 16-row tile, and tile sizes, warps and
stages do not change the k order of the tensor-core accumulation (tested on the GPU)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from xinfer.kernels import arrivals, pdl
from xinfer.kernels.triton import gemv as gemv_jit

MAX_M = 16  # rows per call: one BLOCK_M tile of the kernel
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FAST_DTYPES = (torch.bfloat16, torch.float16)  # the dtypes `wants` sends to Triton


@dataclass(frozen=True)
class GemvConfig:
    """Tiles of one launch. `split_k`: K is cut into that many ranges of a multiple of
    SPLIT_ALIGN columns (fewer when K is short), fixed by (K, split_k) alone."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1


C = GemvConfig
# Tuned on the H200 with bench/bench_gemv.py (2026-12-02): cuBLAS stays where it won.
# Key (N, K, max_m): config for batches of at most max_m rows; the smallest max_m >= M of that
# (N, K) applies, and every (N, K) needs a max_m = 16 entry. None: run cuBLAS (F.linear) for
# that shape. Entries of one (N, K) must be all None or all configs with one split_k.
# Shapes not listed run cuBLAS: untuned Triton tiles lost to it in every sweep case.
GEMV_TABLE: dict[tuple[int, int, int], GemvConfig | None] = {
    # Qwen3-30B-A3B: qkv, o_proj, router
    # qkv: cuBLAS 7.75 µs at one row against ~10 here (2026-12-02 sweep), but cuBLAS cannot
    # take PDL: with PDL on, whole-step decode measured +0.3% (b1) / +2.1% (b8) on this tile
    (5120, 2048, 16): C(block_n=32, block_k=128, num_warps=4, num_stages=4, split_k=2),
    (2048, 4096, 16): C(block_n=32, block_k=128, num_warps=4, num_stages=4, split_k=4),
    (128, 2048, 16): C(block_n=16, block_k=256, num_warps=4, num_stages=4, split_k=8),
    # LM head of the 151936-token vocabularies (Qwen)
    (151936, 2048, 8): C(block_n=32, block_k=256, num_warps=4, num_stages=3),
    (151936, 2048, 16): C(block_n=64, block_k=128, num_warps=4, num_stages=4),
    # Qwen1.5-MoE-A2.7B: qkv, o_proj, shared-expert gate_up and down, router, shared gate
    (6144, 2048, 16): None,
    (2048, 2048, 16): None,
    (11264, 2048, 16): None,
    (2048, 5632, 16): C(block_n=32, block_k=128, num_warps=4, num_stages=4, split_k=4),
    (60, 2048, 16): C(block_n=16, block_k=256, num_warps=4, num_stages=4, split_k=8),
    (1, 2048, 16): C(block_n=16, block_k=256, num_warps=4, num_stages=4, split_k=8),
    # Qwen3.5-35B-A3B (bench_gemv.py sweep, H200, 2026-12-05; µs at M = 1, cuBLAS → this):
    # linear attention's ba 4.92 → 3.96, router 5.63 → 4.13, shared-expert gate_up
    # 12.66 → 5.14, down 3.70 → 3.54, qkvz 15.11 → 14.32; full attention's qkv: cuBLAS
    (64, 2048, 16): C(block_n=16, block_k=256, num_warps=4, num_stages=4, split_k=8),
    (256, 2048, 16): C(block_n=16, block_k=256, num_warps=4, num_stages=4, split_k=8),
    (1024, 2048, 16): C(block_n=32, block_k=256, num_warps=4, num_stages=3, split_k=4),
    (2048, 512, 16): C(block_n=32, block_k=128, num_warps=4, num_stages=4),
    (12288, 2048, 16): C(block_n=32, block_k=128, num_warps=4, num_stages=4),
    (9216, 2048, 16): None,
}
FP32_CONFIG = C(block_n=32, block_k=64, num_warps=4, num_stages=2)  # tests only: any shape
SPLIT_ALIGN = 64  # split-K boundaries: BLOCK_K does not move them, so not the bits either


def _index_table(
    table: dict[tuple[int, int, int], GemvConfig | None],
) -> dict[tuple[int, int], list[tuple[int, GemvConfig | None]]]:
    """(N, K) -> [(max_m, config)] sorted by max_m; raises ValueError on a table whose
    entries could make a row's bits depend on M."""
    by_shape: dict[tuple[int, int], list[tuple[int, GemvConfig | None]]] = {}
    for (n, k, max_m), cfg in sorted(table.items()):
        if not 1 <= max_m <= MAX_M:
            raise ValueError(f"GEMV_TABLE {(n, k, max_m)}: max_m must be in [1, {MAX_M}]")
        by_shape.setdefault((n, k), []).append((max_m, cfg))
    for shape, buckets in by_shape.items():
        cfgs = [cfg for _, cfg in buckets]
        if buckets[-1][0] != MAX_M:
            raise ValueError(f"GEMV_TABLE {shape}: needs an entry for max_m = {MAX_M}")
        if any(c is None for c in cfgs) and any(c is not None for c in cfgs):
            raise ValueError(f"GEMV_TABLE {shape}: cuBLAS for some M buckets but not all")
        if len({c.split_k for c in cfgs if c is not None}) > 1:
            raise ValueError(f"GEMV_TABLE {shape}: M buckets disagree on split_k")
    return by_shape


_BY_SHAPE = _index_table(GEMV_TABLE)


def select(n: int, k: int, m: int, dtype: torch.dtype) -> GemvConfig | None:
    """Config for an (N, K) weight and m rows: the table's entry (smallest max_m >= m),
    FP32_CONFIG for float32; None (cuBLAS) where the table says so or lacks the shape."""
    if dtype == torch.float32:
        return FP32_CONFIG
    buckets = _BY_SHAPE.get((n, k))
    if buckets is None:
        return None
    return next(cfg for max_m, cfg in buckets if m <= max_m)


def wants(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `xinfer.kernels.linear` should run `linear` rather than F.linear: 1..MAX_M rows
    (leading dims flattened), bf16/fp16 throughout, a contiguous 2-D weight, and a table that
    does not pick cuBLAS for the shape."""
    if x.dtype not in _FAST_DTYPES or weight.dtype != x.dtype or weight.dim() != 2:
        return False
    if bias is not None and bias.dtype != x.dtype:
        return False
    rows = math.prod(x.shape[:-1])
    n, k = weight.shape
    return (
        x.shape[-1] == k
        and 0 < rows <= MAX_M
        and weight.is_contiguous()
        and select(n, k, rows, x.dtype) is not None
    )


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if weight.dim() != 2 or x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} mismatch")
    if x.dtype not in _DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"linear: x {x.dtype}, weight {weight.dtype}: expected one of {_DTYPES}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != x.dtype):
        raise ValueError(f"linear: bias {tuple(bias.shape)} {bias.dtype} does not fit")
    if weight.stride(1) != 1:
        raise ValueError("linear: weight must be contiguous in its last dim")
    if math.prod(x.shape[:-1]) > MAX_M:
        raise ValueError(f"linear: at most {MAX_M} rows, got x {tuple(x.shape)}")


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """Triton twin of `reference.linear` for x (..., K) with at most MAX_M rows: (..., N) in
    x's dtype, float32 accumulation. `config` overrides `select` (tests, benchmarks)."""
    _check(x, weight, bias)
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = x2.new_empty(m, n)
    if m and n:
        config = config or select(n, k, m, x.dtype)
        if config is None:
            raise ValueError(f"linear: GEMV_TABLE picks cuBLAS for ({n}, {k}); pass a config")
        _launch(x2, weight, bias, out, config)
    return out.view(*x.shape[:-1], n)


def _launch(x, weight, bias, out, cfg: GemvConfig) -> None:
    m, k = x.shape
    n = weight.shape[0]
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), SPLIT_ALIGN) * SPLIT_ALIGN
    splits = triton.cdiv(k, k_per_split) if k else 1  # non-empty splits only
    n_tiles = triton.cdiv(n, cfg.block_n)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # fp32 must not use tf32
    sk = SplitK.plan(out, k_per_split, splits, n_tiles, bias is not None)
    gemv_jit.gemv_kernel[(n_tiles, splits)](
        x, weight, sk.bias(bias, x), sk.part, out, sk.counters,
        m, n, k, k_per_split,
        x.stride(0), weight.stride(0), *sk.part_strides, out.stride(0),
        HAS_BIAS=sk.fuse_bias, BLOCK_M=MAX_M, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        DOT_PRECISION=precision, REDUCE=sk.reduce, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **pdl.options(x),
    )  # fmt: skip
    sk.finish(bias, out)


# split-K linears add their partials in each output tile's last split (one launch fewer a
# linear, the same bits; `split_tail`); False: the separate reduce kernel, as before
FUSED_SPLIT_REDUCE = True


def split_tail(out: torch.Tensor, splits: int, tiles: int) -> tuple[torch.Tensor, bool]:
    """(counters, REDUCE) for a split-K launch of `tiles` output tiles into `out`: REDUCE
    when it splits, FUSED_SPLIT_REDUCE is on and `arrivals` gives counters (one a tile);
    otherwise the caller runs `reduce_splits` (same bits)."""
    found = arrivals.counters(out.device, tiles) if splits > 1 and FUSED_SPLIT_REDUCE else None
    return (out, False) if found is None else (found, True)


@dataclass(frozen=True)
class SplitK:
    """The split-K plumbing every decode linear shares (here, `quant_launch`, `gguf_launch`):
    the float32 partials `part` (splits, M, N), or `out` itself when K is not split; the
    arrival counters and REDUCE flag of `split_tail`; whether the kernel adds the bias
    (`fuse_bias`: unsplit, or reduced in the last split). `finish` runs the separate reduce
    where the kernel did not."""

    k_per_split: int
    splits: int
    part: torch.Tensor
    counters: torch.Tensor
    reduce: bool
    fuse_bias: bool

    @classmethod
    def plan(
        cls, out: torch.Tensor, k_per_split: int, splits: int, programs: int, has_bias: bool
    ) -> SplitK:
        """`programs`: the launch's output tiles (one arrival counter each)."""
        m, n = out.shape
        part = out if splits == 1 else out.new_empty(splits, m, n, dtype=torch.float32)
        counters, reduce = split_tail(out, splits, programs)
        fuse_bias = has_bias and (splits == 1 or reduce)
        return cls(k_per_split, splits, part, counters, reduce, fuse_bias)

    @property
    def part_strides(self) -> tuple[int, int]:
        """The kernels' (split stride, row stride) of `part`."""
        return (self.part.stride(0) if self.splits > 1 else 0, self.part.stride(-2))

    def bias(self, bias: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
        """The kernel's bias argument: `bias` where it adds it, else any tensor."""
        return bias if self.fuse_bias else placeholder

    def finish(self, bias: torch.Tensor | None, out: torch.Tensor) -> None:
        if self.splits > 1 and not self.reduce:
            reduce_splits(self.part, bias, out)


DECODE_ROWS = 16  # quantized decode linears: at most this many rows (one BLOCK_M = 16 tile)
DECODE_PROGRAMS = 512  # ... split K, from the shape only, until about this many programs run


def decode_split(
    m: int, n_tiles: int, k: int, chunk: int, programs: int | None = None
) -> tuple[int, int]:
    """(K per split, splits) of a quantized decode linear (`quant_launch`, `gguf_tiles`):
    calls of at most DECODE_ROWS rows with fewer than `programs` (default DECODE_PROGRAMS)
    tiles of N split K into whole `chunk`s (their tile's K), at least two chunks a split.
    From the shapes only, so a row's bits do not depend on the batch; `programs` 0 never
    splits (the tiles' `split_programs`: benchmarks compare)."""
    programs = DECODE_PROGRAMS if programs is None else programs
    chunks = triton.cdiv(k, chunk)
    splits = 1
    if m <= DECODE_ROWS and programs > 0:
        splits = max(1, min(programs // n_tiles, chunks // 2))
    per_split = triton.cdiv(chunks, splits)
    return per_split * chunk, triton.cdiv(chunks, per_split)


def reduce_splits(part: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """out (M, N) = the float32 partial sums part (splits, M, N) added in split order (so the
    bits do not depend on timing), plus bias, in out's dtype. The split-K decode linears
    (here, quant_launch, gguf_launch) end with it."""
    splits, m, n = part.shape
    block = min(1024, max(128, triton.next_power_of_2(n)))  # few compiles for any N
    gemv_jit.gemv_split_reduce_kernel[(m, triton.cdiv(n, block))](
        part, bias if bias is not None else part, out,
        n, part.stride(0), part.stride(1), out.stride(0),
        SPLIT_K=splits, HAS_BIAS=bias is not None, BLOCK_N=block, num_warps=4,
    )  # fmt: skip
