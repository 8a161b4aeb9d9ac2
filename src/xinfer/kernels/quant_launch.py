"""Launchers of the quantized-format kernels (`triton/quant_gemm.py`, `triton/quant_moe.py`):
`linear` and `fused_moe` for any format that describes its tensors as `KernelWeights`. Called
through `xinfer.kernels.format_linear` / `format_moe` on CUDA tensors (and by the tests on CPU
tensors under TRITON_INTERPRET=1). No host sync: safe in CUDA graphs. Linears of at least
PREFILL_MIN_ROWS rows, and expert calls of at least PREFILL_MIN_PAIRS pairs in a format that
asks for it (`dequant_experts_in_prefill`), take `quant_prefill` (dequantize to the
activation dtype, then the bf16 kernels) unless `dequant=False` asks for the in-register
GEMMs; smaller ones (decode), and the other formats' expert calls, dequantize in registers.
Act-order int4 weights (a `perm`): linears and the expert kernels take x gathered into the
codes' column order first (`permute_launch`; for the experts one row a pair, read with TOP_K
1) and run the plain kernels.

Determinism: tile sizes depend only on (M bucket, N, K, dtype) for linears and on
(T*k bucket, H, I, dtype) for experts, never on ids, so an expert's bits do not depend on
which slot holds it; decode linears (M <= 16) use one config, so a row's bits do not
depend on the batch (the GEMV form, DECODE_GEMV, gives each row an accumulator of its own
and the same arithmetic whatever the other rows)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton

from xinfer import kernels
from xinfer.kernels import gemv_launch, moe_align, moe_launch, pdl, permute_launch, quant_prefill
from xinfer.kernels.quant_groups import group_t, packed
from xinfer.kernels.triton import quant_gemm as jit
from xinfer.kernels.triton import quant_moe as moe_jit
from xinfer.quant.base import KernelWeights, WeightFormat

DECODE_M = gemv_launch.DECODE_ROWS  # linears with at most this many rows: the decode tile
# From these sizes on, linears take `quant_prefill` (dequantize, then the bf16 kernels), and
# expert calls do where their format asks for it (`dequant_experts_in_prefill`: NVFP4; the
# GGUF block types have their own route, gguf_launch); below them the in-register GEMMs.
# The dequantized path moves ~5x (FP8) to ~9x (4-bit) the stored bytes of the weights it
# touches, which pays once a call has enough rows per weight and not for decode batches.
# Measured on an H100 (2026-12-05, thirteenth session; `bench/bench_quant_kernel.py` times
# both paths at T = 32 and 2048), dequantized / in registers, µs: linear 2048 x 5120 x 2048
# FP8 101.7 / 171.8, GPTQ 155.8 / 311.3, NVFP4 129.0 / 1,007.0; MoE at 2,048 tokens FP8
# 2,890.6 / 804.9, GPTQ 3,187.5 / 2,259.7, NVFP4 3,829.4 / 4,368.4; MoE at 32 tokens in
# registers everywhere (FP8 1,076.5 / 294.8).
PREFILL_MIN_ROWS = 128
PREFILL_MIN_PAIRS = 1024
# MoE GEMV: multiply the codes' values by x and scale each group's sum once (float32, within
# the twin's tolerance), instead of rounding every dequantized weight to the dtype as the twin
# does (its bits). Faster on the H200 for every format (`bench_quant_kernel.py`, graph-timed,
# each variant checked against the twin first; 2026-12-05), µs for 1 / 8 tokens, per weight
# → per group: FP8 block 25.1 → 20.2 / 136.2 → 113.3, NVFP4 51.2 → 44.2 / 316.9 → 313.6,
# GPTQ 34.6 → 33.5 / 227.1 → 219.5. Still batch-invariant and slot-independent (each pair's
# sums in a fixed order).
FACTORED = True
# Decode linears (M <= DECODE_M) without `tl.dot`: multiply-adds on the tile dequantized in
# registers, as the MoE GEMV, four x rows a program (`quant_linear_rows_kernel`: the tile
# decoded once for them) or one (`quant_linear_gemv_kernel`). The 16-row dot tile ran far
# from the bytes on the H200 (FP8 1 x 5120 x 2048 10.2 µs = 1.03 TB/s, NVFP4 36.0 µs =
# 0.16 TB/s, 2026-12-05) while the MoE GEMV reads FP8 at 1.87 TB/s; its serial chain (load,
# decode, layout conversion through shared memory, MMA) is what this removes. Measured on
# an H100 (2026-12-05, thirteenth session), 5120 x 2048, µs at 1 / 8 rows, GEMV form vs dot
# tile: FP8 5.6 (one row alone) / 25.8 vs 10.4 / 10.3, GPTQ 8.5 / 31.8 vs 12.7 / 12.9,
# NVFP4 6.7 / 27.7 vs 35.8 / 36.0: the GEMV form wins at one row and loses at eight for FP8
# and GPTQ (one tile per bucket: a trade, bench/NOTES.md). False: the dot tile (tiles with
# `block_m` 16 choose it too).
DECODE_GEMV = True
# A decode call of one row runs the one-row GEMV (`quant_linear_gemv_kernel`) where the
# four-row kernel would, for the formats whose `decode_one_row_alone` says the two compiled
# kernels give a row the same bits. The source computes a row alike in both (per-group sums
# of the same products, scaled once, summed over groups at the end), but the order of a
# group's sum follows the register layout the compiler picks for each kernel: on an H100
# (2026-12-05, fifteenth session) every row alone equals its row in 16 for FP8, while the
# 4-bit formats (GPTQ, AWQ, compressed-tensors, NVFP4) differ in 1 to 8 rows of 16 (rare
# rounding: 4-bit × bf16 products are exact, their sums mostly so). Measured on an H100
# (thirteenth session), µs at one row, four-row → one-row, same tile: qkv 1 x 5120 x 2048
# FP8 6.5 → 5.6, GPTQ 13.2 → 8.5, NVFP4 12.6 → 6.7; o_proj 1 x 2048 x 4096 FP8 6.5 → 6.0,
# GPTQ 9.9 → 8.6, NVFP4 9.3 → 7.2. False: no call of one row takes the one-row kernel;
# True: those of a format that asks for it, and every call that names no format (`fmt`
# None: tests and benchmarks of the kernels).
ONE_ROW_ALONE = True
# A call of one row on the four-row kernel (the formats without `decode_one_row_alone`)
# compiles rows 1-3 out (`quant_linear_rows_kernel`'s ROWS = 1: no branches in the loop),
# row 0's operations as in the four-row build. On an H100 (2026-12-05, sixteenth session)
# both builds give every row the same bits (`test_one_row_pruned_build_matches_the_batch`:
# GPTQ, AWQ, compressed-tensors, NVFP4 at 5120 x 2048 and 2048 x 4096; the batch-invariance
# test with it on: 12 passed), µs at one row, four-row → pruned (default tiles): GPTQ qkv
# 10.3 → 10.2, o_proj 11.0 → 9.0; NVFP4 12.7 → 8.4, 9.2 → 8.5; end to end batch 1 GPTQ 262
# → 276 tok/s, NVFP4 270 → 294. The interpreter checks the arithmetic. Its Q4_K twin failed
# only with a bias (2026-12-07); both tests, with a bias too, passed on an H100 then
# (thirty-third session, every format).
ONE_ROW_PRUNED = True
# The MoE GEMV's gate and up tiles in one loop (`QuantTiles.joined`) rather than one loop
# after the other, for the formats whose `moe_gemv_joined` asks for it: half the dependent
# iterations a program, x loaded once for both; same bits. Measured on an H100 (2026-12-05,
# thirteenth session), µs at 1 / 8 tokens: FP8 20.0 → 17.4 / 116.4 → 102.4, NVFP4 26.8 →
# 23.6 / 162.7 → 145.0 (GPTQ: quant/int4.py). False: never.
JOINED = True
# int4 words (GPTQ, AWQ, compressed-tensors): each code's fp16 (1024 + code) less (1024 +
# zero) two codes an instruction (`sub.f16x2`, inline PTX), instead of a float32 subtraction
# a code; both are exact, so the bits do not change. sm_90 SASS (`bench/sass_report.py`,
# 2026-12-07): the one-row GPTQ linear's loop 509 → 473 instructions. Measured on an H100
# (2026-12-07, Qwen3-30B-A3B shape GPTQ, resident, `bench_decode_switches.py`), tok/s at batch
# 1 / 8, off → on: 313.4 / 701.5 → 322.2 / 757.5. The interpreter takes the float32
# subtraction (`kernels.inline_asm`). False: always the float32 subtraction.
HALF2_ZERO = True
# The MoE GEMV reads 4-bit codes as four 32-bit words (16 bytes) a thread where the weights
# allow it (`word_vec`), not one word: a quarter of the load instructions, and a group's
# sum mostly within a thread (shuffles 64 → 8 a program). sm_90 SASS of the GPTQ MoE GEMV
# (2026-12-07, with HALF2_ZERO), instructions a call executes at the H200's issue rate:
# gate/up 8.2 → 6.1 µs, down 4.4 → 3.7 (a layout conversion of x through shared memory
# once a program added). The decode linears keep one word (their loop converts x every
# step: 473 → 506). Other bits than one word (another order of the sums), the same for
# every slot and batch. Measured as HALF2_ZERO's row above, 1 → 4: 299.9 / 639.2 → 322.2 /
# 757.5 tok/s. 1: one word a thread.
MOE_WORD_VEC = 4
# The factored GEMVs (decode linears, MoE GEMV) of a format that asks for it
# (`factored_chunks`: FP8) sum a tile's products eight neighbouring columns at a time (in one
# thread), scale each such sum and keep them across the K steps, summing across threads
# once at the end; otherwise each group's sum crosses the threads every step (shuffles) and
# is then scaled. Other bits (another order of the sums), batch-invariant and
# slot-independent as before. sm_90 SASS (2026-12-07), loop instructions, off → on: GPTQ
# linear one row 473 → 412, eight rows 1,003 → 754; FP8 linear 355 → 329 / 746 → 644; FP8 MoE
# GEMV gate/up 5.7 → 5.0 µs of issue. Measured end to end on an H100 (2026-12-07, Qwen3-30B-A3B
# shape, `bench_decode_switches.py`), tok/s at batch 1 / 8: GPTQ 321.2 / 756.0 → 307.9 / 638.9
# (slower: not taken), FP8 367.0 / 1,067.0 → 383.0 / 1,051.8. Groups of 32 columns or more
# (`chunk`). False: never.
CHUNK_SUMS = True


@dataclass(frozen=True)
class QuantTiles:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    down_block_n: int = 0  # MoE GEMV: the down projection's rows per program (0: block_n)
    factored: bool | None = None  # MoE GEMV: scale group sums, not weights (None: FACTORED)
    split_programs: int | None = None  # decode linears' split-K target (None: the default)
    joined: bool = False  # MoE GEMV: the gate and up tiles read in one loop, not two
    word_vec: int = 1  # MoE GEMV: 4-bit words a thread loads at once (`word_vec`)
    chunk: bool = False  # factored GEMVs: sums eight columns a thread (`chunk`, CHUNK_SUMS)


def _decode_block_k(kw: KernelWeights) -> int:
    """Columns per decode tile: about 2 KB of stored bytes a row tile of 8 (the bf16 GEMVs'
    best measured tile is 8 x 128 x 2 bytes), so 256 for FP8 and 512 for 4-bit codes."""
    return 512 if packed(kw) else 256 if kw.fmt_code == 1 else 128


def gemv_tiles(fmt: WeightFormat, kw13: KernelWeights) -> QuantTiles:
    """The MoE GEMV's default tiles (decode) for `fmt` (its gate/up weights `kw13`): 8 rows
    a program, 16 for the down projection; the format's columns a step (`moe_gemv_block_k`;
    default ~2 KB of stored bytes a row tile) and gate and up in one loop where it asks for
    it (`moe_gemv_joined`, and JOINED)."""
    return QuantTiles(
        block_m=1, block_n=8, block_k=fmt.moe_gemv_block_k or _decode_block_k(kw13),
        num_warps=8, down_block_n=16, joined=JOINED and fmt.moe_gemv_joined,
        word_vec=MOE_WORD_VEC, chunk=fmt.factored_chunks,
    )  # fmt: skip


def linear_tiles(
    m: int,
    dtype: torch.dtype,
    kw: KernelWeights | None = None,
    k: int | None = None,
    fmt: WeightFormat | None = None,
) -> QuantTiles:
    """The linear's tiles from (M bucket, dtype, format, K), never from M within a bucket
    but for kernels of the same bits, so a decode row's bits do not depend on the batch.
    Decode (M <= DECODE_M): the GEMV form (DECODE_GEMV) on the format's measured tile
    (`decode_linear_tiles`; default 8 rows of ~2 KB of stored bytes, 8 warps), four rows a
    program where the weight allows it (`rows_tiles_fit`: each tile decoded once for four
    rows) unless one row comes alone on a format whose one-row kernel has the four-row
    kernel's bits (ONE_ROW_ALONE, `decode_one_row_alone`), else one; or the 16-row dot tile."""
    if m <= DECODE_M and DECODE_GEMV:
        block_n, block_k, warps = 8, _decode_block_k(kw) if kw is not None else 128, 8
        if fmt is not None and fmt.decode_linear_tiles:
            block_n, block_k, warps = fmt.decode_linear_tiles
        fits = FACTORED and kw is not None and k is not None and rows_tiles_fit(kw, block_k, k)
        alone = ONE_ROW_ALONE and (fmt is None or fmt.decode_one_row_alone)
        four = fits and not (alone and m == 1)
        chunked = fmt is not None and fmt.factored_chunks
        return QuantTiles(
            block_m=4 if four else 1, block_n=block_n, block_k=block_k, num_warps=warps,
            chunk=chunked,
        )  # fmt: skip
    if m <= DECODE_M:  # weight-bound: narrow N tiles, K split below, give every SM work
        block_k = _decode_block_k(kw) // 2 if kw is not None else 128
        return QuantTiles(block_m=16, block_n=32, block_k=block_k, num_warps=4)
    if dtype == torch.float32:
        return QuantTiles(block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=2)
    return QuantTiles(block_m=64, block_n=64, block_k=64, num_warps=4)


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _args(kw: KernelWeights, expert_dim: bool) -> tuple:
    """(w, s, z, strides...) with the expert stride first when `expert_dim`."""
    z = kw.z if kw.z is not None else kw.s
    if expert_dim:
        return (kw.w, kw.s, z), (
            kw.w.stride(0), kw.w.stride(1), kw.s.stride(0), kw.s.stride(1),
            z.stride(0), z.stride(1),
        )  # fmt: skip
    return (kw.w, kw.s, z), (kw.w.stride(0), kw.s.stride(0), z.stride(0) if z.dim() > 1 else 1)


def words(kw: KernelWeights, block_k: int, k: int) -> bool:
    """Whether the GEMVs may read `kw`'s 4-bit codes as 32-bit words (`load_raw_words`):
    groups of whole words and every row (and expert) starting on a 4-byte boundary."""
    return (
        packed(kw)
        and group_t(kw, block_k, k) % 8 == 0
        and k % 8 == 0
        and kernels.rows_aligned(kw.w, 4)
    )


def word_vec(kw: KernelWeights, block_k: int, k: int, vec: int) -> int:
    """How many 32-bit words of 4-bit codes a GEMV thread loads at once: `vec` where the
    words (`words`) come in aligned runs of `vec` (a group whole runs, every row and expert
    and the base on a 4·vec-byte boundary), else 1. From the shapes, strides and base, which
    are alike for a format's every expert set and slot cache (each its own allocation)."""
    if vec <= 1 or not words(kw, block_k, k):
        return 1
    aligned = kernels.rows_aligned(kw.w, 4 * vec) and group_t(kw, block_k, k) % (8 * vec) == 0
    return vec if aligned else 1


def chunk(group: int, tiles: QuantTiles) -> int:
    """The factored GEMVs' CHUNK for groups of `group` columns on `tiles` (their `chunk`, from
    the format's `factored_chunks`, and CHUNK_SUMS): 8, or 0 (each group's sum across the
    threads every step) when off or for groups under 32 columns (NVFP4's 16: its MoE GEMV's
    SASS grew, gate/up 6.2 → 7.1 µs of issue)."""
    return 8 if CHUNK_SUMS and tiles.chunk and group >= 32 and group % 8 == 0 else 0


def half2(kw: KernelWeights) -> bool:
    """Whether the int4 word decode subtracts the zero two codes at once (HALF2_ZERO)."""
    return HALF2_ZERO and kw.fmt_code == 2 and packed(kw) and kernels.inline_asm()


def even(n: int, k: int, block_n: int, block_k: int) -> bool:
    """Whether a GEMV's tiles cover its (N, K) whole (K splits are whole tiles too): its loads
    of codes and activations need no masks (EVEN)."""
    return n % block_n == 0 and k % block_k == 0


def _fmt_kw(kw: KernelWeights) -> dict:
    return dict(FMT=kw.fmt_code, SCALE_BN=kw.scale_bn, SCALE_BK=kw.scale_bk, HAS_ZERO=kw.has_zero)


def linear(
    x: torch.Tensor,
    fmt: WeightFormat,
    tensors: dict[str, torch.Tensor],
    bias: torch.Tensor | None,
    n: int,
    k: int,
    tiles: QuantTiles | None = None,
    dequant: bool | None = None,
) -> torch.Tensor:
    """x (..., K) @ W^T (+ bias) in x's dtype, W (N, K) stored in `fmt`. `dequant`: whether
    to take `quant_prefill` (default: from PREFILL_MIN_ROWS rows); `tiles`: the in-register
    kernel's."""
    kw = fmt.kernel_weights(tensors, k)
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m == 0:
        return x.new_empty(*x.shape[:-1], n)
    if m >= PREFILL_MIN_ROWS if dequant is None else dequant:
        return quant_prefill.linear(x2, kw, bias, n, k).view(*x.shape[:-1], n)
    if kw.perm is not None:  # act-order: x in the codes' column order, then the plain kernels
        x2, kw = permute_launch.columns(x2, kw.perm), dataclasses.replace(kw, perm=None)
    out = x.new_empty(m, n)
    tiles = tiles or linear_tiles(m, x.dtype, kw, k, fmt)
    if tiles.block_m in (1, 4):
        if m > DECODE_M:
            raise ValueError(f"quant linear: the GEMV tiles take at most {DECODE_M} rows")
        _gemv_linear(x2, kw, bias, out, tiles)
        return out.view(*x.shape[:-1], n)
    sk, grid = _split(x2, out, tiles, bias)
    (w, s, z), (swn, ssn, szn) = _args(kw, expert_dim=False)
    jit.quant_linear_kernel[grid](
        x2, w, s, z, sk.bias(bias, s), sk.part, out, sk.counters,
        m, n, k, sk.k_per_split,
        x2.stride(0), swn, ssn, szn, *sk.part_strides, out.stride(0),
        **_fmt_kw(kw), HAS_BIAS=sk.fuse_bias,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        GROUP_T=group_t(kw, tiles.block_k, k),
        DOT_PRECISION=_precision(x.dtype), REDUCE=sk.reduce, num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )  # fmt: skip
    sk.finish(bias, out)
    return out.view(*x.shape[:-1], n)


def _split(x2, out, tiles: QuantTiles, bias) -> tuple[gemv_launch.SplitK, tuple[int, int, int]]:
    """The split-K plan and grid (row programs, N tiles, splits) of a decode linear: K split
    from the shape alone (`gemv_launch.decode_split`)."""
    (m, k), n = x2.shape, out.shape[1]
    n_tiles = triton.cdiv(n, tiles.block_n)
    k_per_split, splits = gemv_launch.decode_split(
        m, n_tiles, k, tiles.block_k, tiles.split_programs
    )
    m_programs = triton.cdiv(m, tiles.block_m)
    sk = gemv_launch.SplitK.plan(out, k_per_split, splits, m_programs * n_tiles, bias is not None)
    return sk, (m_programs, n_tiles, splits)


def _gemv_linear(x2, kw: KernelWeights, bias, out, tiles: QuantTiles) -> None:
    """out (M, N) = x2 @ W^T (+ bias) in the GEMV form, K split from the shape alone
    (`gemv_launch.decode_split`): `quant_linear_gemv_kernel` (block_m 1: grid (M, N tiles,
    splits)) or `quant_linear_rows_kernel` (block_m 4: four rows a program, each tile
    decoded once for them; factored sums, FP8 or 4-bit words only — `rows_tiles_fit`)."""
    (m, k), n = x2.shape, out.shape[1]
    sk, grid = _split(x2, out, tiles, bias)
    (w, s, z), (swn, ssn, szn) = _args(kw, expert_dim=False)
    factored = FACTORED if tiles.factored is None else tiles.factored
    args = (
        x2, w, s, z, sk.bias(bias, s), sk.part, out, sk.counters,
        m, n, k, sk.k_per_split,
        x2.stride(0), swn, ssn, szn, *sk.part_strides, out.stride(0),
    )  # fmt: skip
    gt = group_t(kw, tiles.block_k, k)
    consts = dict(
        **_fmt_kw(kw), PACKED=packed(kw), HAS_BIAS=sk.fuse_bias, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, GROUP_T=gt, CHUNK=chunk(gt, tiles), REDUCE=sk.reduce,
        EVEN=even(n, k, tiles.block_n, tiles.block_k), num_warps=tiles.num_warps,
        HALF2=half2(kw), **pdl.options(x2),
    )  # fmt: skip
    if tiles.block_m == 4:
        if not (factored and rows_tiles_fit(kw, tiles.block_k, k)):
            raise ValueError("quant linear: four-row tiles need factored sums and FP8 or words")
        rows = 1 if m == 1 and ONE_ROW_PRUNED else 4
        jit.quant_linear_rows_kernel[grid](*args, **consts, ROWS=rows)
    else:
        jit.quant_linear_gemv_kernel[grid](
            *args, **consts, FACTORED=factored, WORDS=words(kw, tiles.block_k, k)
        )
    sk.finish(bias, out)


def rows_tiles_fit(kw: KernelWeights, block_k: int, k: int) -> bool:
    """Whether `quant_linear_rows_kernel` reads `kw`: FP8 codes, or 4-bit codes by words."""
    return not packed(kw) or words(kw, block_k, k)


def dequantizes_experts(fmt: WeightFormat, num_pairs: int) -> bool:
    """Whether an expert call of `num_pairs` pairs in `fmt` takes `quant_prefill`: from
    PREFILL_MIN_PAIRS pairs, where the format asks for it (`dequant_experts_in_prefill`)."""
    return num_pairs >= PREFILL_MIN_PAIRS and fmt.dequant_experts_in_prefill


def moe_merge_key(num_pairs: int, hidden: torch.Tensor, fmt: WeightFormat) -> object | None:
    """The merge key of an expert call in `fmt` from PREFILL_MIN_PAIRS pairs: `quant_prefill`'s
    where it dequantizes, else the in-register grouped GEMMs' (each row's bits depend on its
    x row, the weights and the tiles only; calls of that many pairs or more share the tiles);
    none below (the GEMV and the small-call tiles are never joined)."""
    if num_pairs < PREFILL_MIN_PAIRS:
        return None
    if dequantizes_experts(fmt, num_pairs):
        return quant_prefill.moe_merge_key(num_pairs, hidden, PREFILL_MIN_PAIRS)
    if not kernels.use_triton(hidden):
        return None
    return ("registers", grouped_tiles(num_pairs, hidden.dtype, fmt))


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    fmt: WeightFormat,
    w13: dict[str, torch.Tensor],
    w2: dict[str, torch.Tensor],
    inter: int,
    use_gemv: bool | None = None,
    tiles: QuantTiles | None = None,
    dequant: bool | None = None,
    max_ids: int | None = None,
) -> torch.Tensor:
    """Routed experts on `[N, ...]` expert sets stored in `fmt` (N experts or slots).
    `use_gemv` (default: at most MAX_GEMV_PAIRS pairs) or else the grouped path, there
    `dequant` `quant_prefill` (default from PREFILL_MIN_PAIRS pairs) or the in-register
    grouped GEMMs; `tiles`: the chosen kernels' (as `moe_launch.MoeConfig` for the former).
    `max_ids`: at most this many distinct ids in `topk_ids` (`quant_prefill.id_bound`)."""
    if hidden.dim() != 2 or topk_ids.shape != topk_weights.shape:
        raise ValueError("fused_moe: expected hidden (T, H) and topk_ids/weights (T, k)")
    num_tokens, top_k = topk_ids.shape
    hidden_dim = hidden.shape[1]
    num_pairs = num_tokens * top_k
    kw13, kw2 = fmt.kernel_weights(w13, hidden_dim), fmt.kernel_weights(w2, inter)
    if kw2.perm is not None:
        raise ValueError("fused_moe: w2 takes no perm (act-order folds it into w13's rows)")
    if use_gemv is None:
        use_gemv = num_pairs <= moe_launch.MAX_GEMV_PAIRS
    if dequant is None:
        dequant = dequantizes_experts(fmt, num_pairs)
    if not use_gemv and dequant:
        cfg = tiles and moe_launch.MoeConfig(
            block_n=tiles.block_n, block_k=tiles.block_k, num_warps=tiles.num_warps,
            block_m=tiles.block_m, num_stages=tiles.num_stages,
        )  # fmt: skip
        return quant_prefill.fused_moe(
            hidden, topk_ids, topk_weights, kw13, kw2, inter, cfg, max_ids=max_ids
        )
    hidden, topk_ids, topk_weights, out = moe_launch.moe_inputs(hidden, topk_ids, topk_weights)
    if num_pairs == 0:
        return out
    inter_buf = hidden.new_empty(num_pairs, inter)  # (T*k, I)
    y = hidden.new_empty(num_pairs, hidden_dim)  # (T*k, H) unweighted expert outputs
    (a13, s13), (a2, s2) = _args(kw13, True), _args(kw2, True)
    x13, x13_top_k = hidden, top_k
    if kw13.perm is not None:  # act-order: a row a pair in its expert's order, in y
        x13, x13_top_k = permute_launch.pair_rows(hidden, topk_ids, kw13.perm, y), 1
    if use_gemv:
        t = tiles or gemv_tiles(fmt, kw13)
        factored = FACTORED if t.factored is None else t.factored
        grid = (num_pairs, triton.cdiv(inter, t.block_n))
        gt13 = group_t(kw13, t.block_k, hidden_dim)
        moe_jit.quant_moe_gate_up_gemv_kernel[grid](
            x13, topk_ids, *a13, inter_buf, hidden_dim, inter,
            x13.stride(0), *s13, inter_buf.stride(0),
            **_fmt_kw(kw13), PACKED=packed(kw13), TOP_K=x13_top_k, BLOCK_N=t.block_n,
            BLOCK_K=t.block_k, GROUP_T=gt13, CHUNK=chunk(gt13, t) if factored else 0,
            FACTORED=factored, WORDS=words(kw13, t.block_k, hidden_dim),
            EVEN=even(inter, hidden_dim, t.block_n, t.block_k), JOINED=t.joined,
            WORD_VEC=word_vec(kw13, t.block_k, hidden_dim, t.word_vec), HALF2=half2(kw13),
            num_warps=t.num_warps, **pdl.options(hidden),
        )  # fmt: skip
        down_n = t.down_block_n or t.block_n
        grid = (num_pairs, triton.cdiv(hidden_dim, down_n))
        down_k = min(t.block_k, triton.next_power_of_2(inter))
        gt2 = group_t(kw2, down_k, inter)
        counters, fused = moe_launch.combine_tail(out, down_n)
        moe_jit.quant_moe_down_gemv_kernel[grid](
            inter_buf, topk_ids, *a2, y, topk_weights, out, counters, hidden_dim, inter,
            inter_buf.stride(0), *s2, y.stride(0), out.stride(0),
            **_fmt_kw(kw2), PACKED=packed(kw2), BLOCK_N=down_n,
            BLOCK_K=down_k, GROUP_T=gt2, CHUNK=chunk(gt2, t) if factored else 0, FACTORED=factored,
            TOP_K=top_k, COMBINE=fused, WORDS=words(kw2, down_k, inter),
            EVEN=even(hidden_dim, inter, down_n, down_k),
            WORD_VEC=word_vec(kw2, down_k, inter, t.word_vec), HALF2=half2(kw2),
            num_warps=t.num_warps, **pdl.options(hidden),
        )  # fmt: skip
    else:
        fused = False
        t = tiles or grouped_tiles(num_pairs, hidden.dtype, fmt)
        num_ids = kw13.w.shape[0]
        sorted_pairs, block_ids, num_rows = moe_align.align_pairs(
            topk_ids, num_ids, t.block_m, max_ids=max_ids
        )
        common = dict(BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
                      DOT_PRECISION=_precision(hidden.dtype), num_warps=t.num_warps,
                      num_stages=t.num_stages)  # fmt: skip
        grid = (block_ids.numel() * triton.cdiv(inter, t.block_n),)
        moe_jit.quant_moe_gate_up_grouped_kernel[grid](
            x13, sorted_pairs, block_ids, num_rows, *a13, inter_buf,
            num_pairs, hidden_dim, inter,
            x13.stride(0), *s13, inter_buf.stride(0),
            **_fmt_kw(kw13), TOP_K=x13_top_k, GROUP_T=group_t(kw13, t.block_k, hidden_dim),
            **common,
        )  # fmt: skip
        grid = (block_ids.numel() * triton.cdiv(hidden_dim, t.block_n),)
        moe_jit.quant_moe_down_grouped_kernel[grid](
            inter_buf, sorted_pairs, block_ids, num_rows, *a2, y,
            num_pairs, hidden_dim, inter,
            inter_buf.stride(0), *s2, y.stride(0),
            **_fmt_kw(kw2), GROUP_T=group_t(kw2, t.block_k, inter), **common,
        )  # fmt: skip
    if not fused:
        moe_launch._combine(y, topk_weights, out, top_k)
    return out


def grouped_tiles(num_pairs: int, dtype: torch.dtype, fmt: WeightFormat) -> QuantTiles:
    """The in-register grouped GEMMs' tiles of an expert call: by the call's pairs and
    dtype only (so a row's bits do not depend on the other rows); past PREFILL_MIN_PAIRS
    pairs the format's measured tile (`moe_prefill_tiles`) where it declares one."""
    if dtype == torch.float32:
        return QuantTiles(block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=2)
    if num_pairs <= PREFILL_MIN_PAIRS:
        # two stages: the per-element scale gathers of block formats (f32, N x K) of gate and
        # up are pipelined too; four stages of them asked 258 KB of shared memory (H200: 227)
        return QuantTiles(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2)
    if fmt.moe_prefill_tiles is not None:
        bm, bn, bk, nw, st = fmt.moe_prefill_tiles
        return QuantTiles(block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=st)
    return QuantTiles(block_m=64, block_n=64, block_k=64, num_warps=4)
