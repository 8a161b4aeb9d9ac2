"""Launchers of the GGUF block kernels (`triton/gguf_gemm.py`): `linear` and `fused_moe` on raw
block rows uint8 (N, K / block_size * type_size). Called through `GGUFFormat.triton_*` on
CUDA tensors (and by the tests on CPU tensors under TRITON_INTERPRET=1). No host sync: safe
in CUDA graphs.

Prefill-sized calls (from `quant_launch.PREFILL_MIN_ROWS` rows, as the other quantized
formats, and PREFILL_MIN_PAIRS expert pairs) dequantize the weights they use to the
activation dtype (`triton/gguf_dequant_kernel.py`) and run the bf16 kernels: cuBLAS for
linears, `moe_launch`'s grouped GEMMs for experts through `quant_prefill.fused_moe_with`
(which numbers the ids a call uses, so an offload slot view costs no more than the layer).
The in-register grouped GEMMs decode every weight once per tile of rows: a 2048-token chunk
of Qwen3-30B-A3B's experts in Q4_K took 2.8 ms (H200, 2026-12-04) against 0.7 ms for the
bf16 grouped GEMMs; the dequantized path decodes each weight once and adds ~2.4 GB of bf16
writes and reads a layer for a call that touches all 128 experts (~0.8 ms at ~3 TB/s). Below
~64 rows an expert both decode each weight once, the in-register kernels more slowly (that
run: ~0.4 T weights/s against the GEMV decoder's ~1.1 T) but without the copies; the expert
threshold sits at 4,096 pairs (512 tokens at top-8), where the two are estimated about even:
decode batches of up to 511 sequences and short prompts keep the in-register kernels.
Placed by arithmetic, not measured: bench/NOTES.md.

Determinism: a linear's path and tiles depend only on its M bucket (<= DECODE_M, below or
from PREFILL_MIN_ROWS), dtype, block type and N (the head tile); an expert call's on its
pair count (GEMV up to MAX_GEMV_PAIRS, in-register grouped, dequantized from
PREFILL_MIN_PAIRS), dtype and block type — never on ids. So a decode row's bits do not
depend on the batch within a bucket, and an expert's bits do not depend on which slot holds
it. (Linears switch to the dequantized route from 128 rows in decode too, e.g. a decode
graph of 128+ sequences; experts keep the in-register kernels up to 4,095 pairs.)"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from xinfer import kernels
from xinfer.kernels import gemv_launch, moe_align, moe_launch, pdl, quant_launch, quant_prefill
from xinfer.kernels import gguf_q8x_launch as q8x
from xinfer.kernels.triton import gguf_dequant_kernel as deq_jit
from xinfer.kernels.triton import gguf_gemm as jit
from xinfer.quant.gguf_blocks import BlockType

DECODE_M = gemv_launch.DECODE_ROWS  # linears with at most this many rows: one 16-row tile
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DEQUANT_BLOCK_N, DEQUANT_SUBS = 32, 8  # dequant tiles: elementwise, the bits do not depend on them
PREFILL_MIN_PAIRS = 4096  # expert calls from this many (token, k) pairs dequantize (above)
# decode GEMVs of Q4_K, Q8_0 and Q6_K weights on int8 activations (`gguf_q8x_launch`: dp4a,
# 2-4x fewer instructions a weight by the sm_90 SASS), experts and linears; chosen by shapes
# and types only, like the tiles; off until the H200 has timed them (bench/NOTES.md)
Q8X_MOE = False
Q8X_LINEAR = False
# Q4_K decode GEMVs (MoE gate/up and down, the four-row decode linear) by 32-bit words,
# factored: each (row, sub-block) sum of q·x and of x scaled once (`triton/gguf_q4k_words.py`),
# float32 throughout, within the twin's tolerance but not its bits. Taken where the rows allow
# 16-byte loads (`q4k_words`: from strides and alignment, alike for every expert set and slot
# cache); else the byte path. Measured on an H100 (2026-12-07, thirty-second session,
# `bench_gguf_kernels.py --types Q4_K`, Qwen3-30B-A3B shapes, CUDA graphs), µs byte → words:
# MoE GEMV 31.4 → 16.2 at one token, 201.5 → 71.1 at eight; decode linear at one row, qkv
# 11.7 → 7.1, o_proj 10.6 → 6.5. Its GPU tests there: 24 passed, 1 failed (a one-row
# build with rows 1-3 compiled out gave another float32 sum); with one build for every row
# count (`q4k_four_rows_dot`; at one row qkv 6.9, o_proj 6.6 µs) the GGUF GPU tests passed
# (79, H100, thirty-third session). The LM head's word tile: `_WORDS_HEAD`.
# False: always the byte path.
Q4K_WORDS = True
# Q6_K decode GEMVs (the four-row decode linear, the LM head among them, and the MoE GEMVs) by
# words, factored per 16-weight group (`triton/gguf_q6k_words.py`): float32 throughout, within
# the twin's tolerance. Taken where the base is 4-aligned and the rows 2-aligned (`q6k_words`);
# else the byte path. Chosen by sm_90 SASS (`_WORDS_GEMV`'s notes). Measured on an H100
# (2026-12-07, thirty-fifth session, `bench_gguf_kernels.py --types Q6_K`, CUDA graphs), µs
# byte → words at one row: LM head 419.1 → 132.5, qkv 17.2 → 8.7, o_proj 15.9 → 7.4; the
# Q4_K_M MoE GEMV (Q6_K down in half the layers) 29.4 at one token. Resident Q4_K_M decode
# 311.2 → 372.1 tok/s (`bench_vs_llamacpp.py`). Its GPU tests there: 121 + 95 passed.
# False: always the byte path.
Q6K_WORDS = True
# Q8_0 decode GEMVs (the four-row decode linear, the LM head among them, and the MoE GEMVs) by
# words, factored per 32-weight block (`triton/gguf_q80_words.py`): float32 throughout, within
# the twin's tolerance. Taken where the base and rows are 8-aligned and K a multiple of 256
# (`q80_words`); else the byte path. Tiles chosen by sm_90 SASS (`_WORDS_GEMV`'s notes).
# Off until a GPU has run its tests (tests/kernels/test_gguf_kernels.py -k q80_words; none
# ran in the session that built it) and `bench_gguf_kernels.py --types Q8_0` has timed it.
# False: always the byte path.
Q80_WORDS = False


@dataclass(frozen=True)
class GGUFTiles:
    """BLOCK_M (dot paths only), BLOCK_N rows per program, SUBS sub-blocks of 32 per step."""

    block_m: int
    block_n: int
    subs: int
    num_warps: int = 4
    num_stages: int = 2
    split_programs: int | None = None  # decode linears' split-K target (None: the default)
    # the Q4_K word path (Q4K_WORDS; `q4k_words`, `_words_consts`): block_n a multiple of 8,
    # subs / 8 super-blocks a step, a multiple of num_warps; GEMVs only (block_m 1 for
    # experts, 4 for the decode linear)
    words: bool = False
    down: GGUFTiles | None = None  # MoE GEMV: the down projection's tile (None: this one)


# Decode tiles swept for vocabulary-sized outputs (LM heads) by block type: the Q4_K head of
# Qwen3-30B-A3B (151,936 x 2048) took 318 µs with one warp and 2 sub-blocks a step against
# 431 µs for the general tile (H200, bench_gguf_kernels.py --sweep, 2026-12-04 sixth session;
# o_proj and qkv gained nothing from it). Other block types' heads are not swept.
HEAD_ROWS = 65536
_SWEPT_HEAD = {"Q4_K": GGUFTiles(block_m=16, block_n=16, subs=2, num_warps=1)}
# The Q4_K head on the word path (Q4K_WORDS; `_path_tiles` falls back to _SWEPT_HEAD where
# the weight does not allow it): four rows a program, 16 rows x one warp, a super-block a
# step. Measured on an H100 (2026-12-07, thirty-third session, `bench_gguf_kernels.py --types
# Q4_K`, 151,936 x 2048, CUDA graphs), µs at one / eight rows: 97.5 / 437.2 against the
# swept byte tile's 315.5 / 312.7 (16 x 8 word tiles 117.5 / 745.9, 16 x 16 x 2 warps 108.5 /
# 470.2, 32 x 8 148.5 / 453.3). One tile serves every decode batch (a row's bits may not
# depend on it): a step gains ~218 µs at one row and pays ~125 µs at eight (more at sixteen
# rows, not timed); resident Q4_K's batch-1 step was 2.715 ms there, the head 0.317 of it.
_WORDS_HEAD = {"Q4_K": GGUFTiles(block_m=4, block_n=16, subs=8, num_warps=1, words=True)}


def linear_tiles(
    m: int,
    dtype: torch.dtype,
    btype: BlockType | None = None,
    n: int = 0,
    words: bool | None = None,
) -> GGUFTiles:
    """The linear's tiles from (M bucket, dtype, block type, N ≥ HEAD_ROWS): never from the
    batch within a bucket, so a decode row's bits do not depend on the batch. `words`: the
    word tile where the block type has one (Q4_K, Q6_K, Q8_0; default its switch, Q4K_WORDS,
    Q6K_WORDS or Q80_WORDS; `linear` falls back to the byte tile where the weight does not
    allow it)."""
    if m <= DECODE_M:  # weight-bound: narrow N tiles give every SM work
        words = (_words_on(btype) if words is None else words) and btype is not None
        tile = None
        if btype is not None and n >= HEAD_ROWS:  # an LM head
            tile = (_WORDS_HEAD.get(btype.name) if words else None) or _SWEPT_HEAD.get(btype.name)
        if tile is None and quant_launch.DECODE_GEMV:  # the GEMV form, four rows a program
            tile = _WORDS_LINEAR.get(btype.name) if words else None
            tile = tile or GGUFTiles(block_m=4, block_n=4, subs=8, num_warps=2)
        return tile or GGUFTiles(block_m=16, block_n=16, subs=8, num_warps=4)
    if dtype == torch.float32:
        return GGUFTiles(block_m=32, block_n=32, subs=2, num_warps=4)
    return GGUFTiles(block_m=64, block_n=64, subs=2, num_warps=8)


_SWEPT_GEMV = {  # w13's block type → its swept best MoE GEMV tile
    "Q4_K": GGUFTiles(block_m=1, block_n=4, subs=8, num_warps=2),
    "Q8_0": GGUFTiles(block_m=1, block_n=4, subs=4, num_warps=2),
}
_SWEPT_GROUPED = {  # w13's block type → its swept best grouped tile at many rows
    "Q4_K": GGUFTiles(block_m=64, block_n=64, subs=2, num_warps=4),
    "Q8_0": GGUFTiles(block_m=64, block_n=64, subs=4, num_warps=4),
}


def gemv_tiles(
    dtype: torch.dtype, btype: BlockType | None = None, words: bool | None = None
) -> GGUFTiles:
    """MoE decode: one program per (pair, BLOCK_N rows); SUBS=8 reads whole super-blocks.
    Swept on the H200 (bench_gguf_kernels.py --sweep, Qwen3-30B-A3B shape, 2026-12-04 fifth
    session, activations in registers), µs for 1 / 8 tokens: Q4_K 4 rows of 2 warps, 31.1 /
    196.0 (best of 24 tiles 30.7 at one token: within noise); Q8_0 4 rows of 2 warps and 4
    blocks a step, 31.4 / 179.3 against 44.9 / 245.2 for the general tile. The other types
    are not swept. `words`: the word tile of Q4_K, Q6_K or Q8_0 (default Q4K_WORDS /
    Q6K_WORDS / Q80_WORDS; `fused_moe` falls back to the byte tile for weights that do not
    allow it, and takes w2's own word tile where its type differs from w13's:
    `_down_tiles`)."""
    del dtype
    name = btype.name if btype else ""
    if (_words_on(btype) if words is None else words) and name in _WORDS_GEMV:
        return _WORDS_GEMV[name]
    return _SWEPT_GEMV.get(name, GGUFTiles(1, 8, 8, num_warps=4))


# The Q4_K word path's tiles (`_words_consts`), chosen by sm_90 SASS (`bench/sass_report.py
# --cases gguf-q4_k,linear-gguf-q4_k`, 2026-12-07, Triton 3.9 and 3.6 alike to +-0.001);
# the choice among them not timed (the chosen tiles were, against the byte path: Q4K_WORDS);
# loop warp instructions a weight, none with shared memory, a barrier or a spill in the loop:
#   rows x warps (a super-block a warp)  8x1    16x1   16x2   32x1   32x2
#   MoE gate/up                          0.131  0.119  0.120  0.112  0.113
#   MoE down                             0.160  0.134  0.133  0.119  0.120
#   decode linear, one row               0.162  0.132  0.133  0.119  0.120
#   registers (gate/up; down, linear)    94;64  127;79 128;71 248;128 234;128
# (the byte path: 0.354, 0.400, 0.746). The rows a thread holds (block_n / 8) share the
# activations it converts; warps past one split K, which leaves the count a weight as it is
# and divides the steps a program runs in sequence, but a step past K still runs (the down
# projection's K = 768 is 3 super-blocks: whole with one warp). Taken: gate/up 16 rows x 2
# warps (768 warps at one token of Qwen3-30B-A3B, 4 steps each); down 32 rows x 1 warp (its
# steps read as many weights as gate/up's, so `sass_cases.py`'s count a step, which it takes
# from the gate/up tile, holds for it too); the decode linear 16 x 2 (qkv: 320 programs).
_WORDS_GEMV = {
    "Q4_K": GGUFTiles(
        block_m=1, block_n=16, subs=16, num_warps=2, words=True,
        down=GGUFTiles(block_m=1, block_n=32, subs=8, num_warps=1, words=True),
    )
}  # fmt: skip
_WORDS_LINEAR = {"Q4_K": GGUFTiles(block_m=4, block_n=16, subs=16, num_warps=2, words=True)}
# The Q6_K word path's tiles (`gguf_q6k_words.py`), chosen by sm_90 SASS (`bench/sass_report.py
# --cases gguf-q6_k-words,linear-gguf-q6_k-words,head-gguf-q6_k-words`, Triton 3.9,
# 2026-12-07), not timed; loop warp instructions a weight (the four-row linear: its loop
# with all four rows' code, against a row's weights, as the Q4_K word linear's 0.318), no
# spill, no shared memory in the loop:
#   rows x warps (a super-block a warp)  8x1    8x2    16x1   16x2   32x1   32x2
#   MoE gate/up                          0.175  0.191  0.158  0.163  0.152  0.152
#   MoE down (K = 768, 630-byte rows)    0.210  0.218  0.175  0.180  0.158  0.164
#   four-row decode linear (K = 2048)    0.549  0.553  0.395  0.397  0.371  0.372
#   registers (gate/up; down; linear)    128;64;123  80;56;126  168;80;211  128;72;211
#                                        255;167;255  255;136;255
# (that sweep with 16-bit weight loads; the taken tiles with the funnel-shifted 32-bit loads
# and the group's two fused multiply-adds after it: gate/up 0.159, down 0.173, linear 0.388,
# head 0.386 (Triton 3.6 alike), and 48 loads a step of the down GEMV instead of 66)
# where the byte path takes 0.696 (gate/up), 0.693 (down), 1.047 (the four-row linear and the
# LM head, which has no swept Q6_K tile). 32 rows a program hold 255 registers in gate/up
# and the linear (the four-row build keeps 32 rows' 64 decoded codes a lane live): taken
# are 16 rows. Gate/up 16 x 2 warps as Q4_K's; down 16 x 1 (at one token 1,024 warps of
# three steps each against 512 at 32 rows: the call is too small for its issue floor, 2.1 µs
# against 2.5 µs of HBM, to decide it); the decode linear 16 x 2, the LM head 16 x 1 warp
# (as Q4_K's `_WORDS_HEAD`: one tile for every decode batch).
_WORDS_GEMV["Q6_K"] = GGUFTiles(
    block_m=1, block_n=16, subs=16, num_warps=2, words=True,
    down=GGUFTiles(block_m=1, block_n=16, subs=8, num_warps=1, words=True),
)  # fmt: skip
_WORDS_LINEAR["Q6_K"] = GGUFTiles(block_m=4, block_n=16, subs=16, num_warps=2, words=True)
_WORDS_HEAD["Q6_K"] = GGUFTiles(block_m=4, block_n=16, subs=8, num_warps=1, words=True)
# The Q8_0 word path's tiles (`gguf_q80_words.py`; a "super-block" there is 256 columns, 8
# blocks, 272 bytes), chosen by sm_90 SASS (`bench/sass_report.py --cases gguf-q8_0-words,
# linear-gguf-q8_0-words,head-gguf-q8_0-words`, Triton 3.9, 2026-12-07), not timed; loop warp
# instructions a weight (the four-row linear's against a row's weights, as Q6_K's):
#   rows x warps (256 columns a warp)    8x1    16x1   16x2   32x1   32x2
#   MoE gate/up                          0.138  0.124  0.127  0.118  0.119
#   MoE down (K = 768, 816-byte rows)    0.166  0.138  0.143  0.125  0.126
#   four-row decode linear (K = 2048)    0.441  0.326  0.328  0.308* -
#   registers (gate/up; down; linear)    61;61;128  95;64;206  94;48;209  162;94;255
# (* 255 registers, ~300 spill instructions in the loop) where the byte path takes 0.350
# (gate/up), 0.422 (down), 0.678 (the four-row linear and the LM head; the head's 16 x 1
# warp word tile 0.326). No shared memory or barrier in the loops. Taken as Q6_K's: gate/up
# 16 x 2 warps, down 16 x 1, the decode linear 16 x 2, the LM head 16 x 1 warp (one tile for
# every decode batch). The HBM floors (6.4 / 3.2 µs at one token) are ~2x the issue floors
# (3.1 / 1.7 µs), so the choice among these is the GPU's to make. The pair's 17 words as
# 32-bit loads took 8% fewer instructions (0.118 / 0.130 / 0.319) and about twice the L1
# line accesses (`gguf_q80_words`'s notes): the 64-bit loads are taken, not timed.
_WORDS_GEMV["Q8_0"] = GGUFTiles(
    block_m=1, block_n=16, subs=16, num_warps=2, words=True,
    down=GGUFTiles(block_m=1, block_n=16, subs=8, num_warps=1, words=True),
)  # fmt: skip
_WORDS_LINEAR["Q8_0"] = GGUFTiles(block_m=4, block_n=16, subs=16, num_warps=2, words=True)
_WORDS_HEAD["Q8_0"] = GGUFTiles(block_m=4, block_n=16, subs=8, num_warps=1, words=True)


def _words_on(btype: BlockType | None) -> bool:
    """The switch of `btype`'s word path (Q4K_WORDS, Q6K_WORDS, Q80_WORDS; False for the
    others)."""
    switches = {"Q4_K": Q4K_WORDS, "Q6_K": Q6K_WORDS, "Q8_0": Q80_WORDS}
    return switches.get(btype.name if btype else "", False)


def q6k_words(w: torch.Tensor, btype: BlockType, k: int) -> bool:
    """Whether the GEMVs may read the block rows `w` by the Q6_K word path: Q6_K, the base on
    a 4-byte boundary and every row (and expert) on a 2-byte one (the path loads aligned
    32-bit words and shifts them by 16 bits where a 210-byte block starts at 2 mod 4). From
    the strides and the base alone, as `q4k_words`."""
    aligned = w.data_ptr() % 4 == 0 and kernels.rows_aligned(w, 2)
    return btype.name == "Q6_K" and k % 256 == 0 and aligned


def q80_words(w: torch.Tensor, btype: BlockType, k: int) -> bool:
    """Whether the GEMVs may read the block rows `w` by the Q8_0 word path: Q8_0, K a
    multiple of 256 (the path's step unit: 8 blocks, 272 bytes), and the base and every row
    (and expert) on an 8-byte boundary (the path loads a block pair's 68 bytes as nine
    aligned 64-bit words from the 8-aligned one at or below it; a row of K = 768 is 816
    bytes). From the strides and the base alone, as `q4k_words`."""
    return btype.name == "Q8_0" and k % 256 == 0 and kernels.rows_aligned(w, 8)


def words_allowed(w: torch.Tensor, btype: BlockType, k: int) -> bool:
    """Whether `w` allows its block type's word path (`q4k_words`, `q6k_words`,
    `q80_words`)."""
    return q4k_words(w, btype, k) or q6k_words(w, btype, k) or q80_words(w, btype, k)


def q4k_words(w: torch.Tensor, btype: BlockType, k: int) -> bool:
    """Whether the GEMVs may read the block rows `w` by the Q4_K word path: Q4_K, and every
    row (and expert) and the base on a 16-byte boundary, so that each row's qs (16 bytes into
    its 144-byte super-blocks) loads 16 bytes at a time. From the strides and the base alone,
    which are alike for a layer's every expert set and slot cache (each its own allocation):
    an expert's bits do not depend on where it is held."""
    return btype.name == "Q4_K" and k % 256 == 0 and kernels.rows_aligned(w, 16)


def _words_consts(t: GGUFTiles) -> dict:
    """The word path's constexprs of tile `t` (none for a byte tile): a warp's lanes hold 8
    rows x the 4 pairs of a super-block, its warps a super-block each (subs / 8 super-blocks
    a step, a multiple of num_warps: K split between them, summed once at the end; more than
    one a warp sit in its registers); each thread holds ROWS_T = block_n / 8 rows in its
    registers, so the activations it loads and converts serve that many rows."""
    if not t.words:
        return {}
    return dict(WORDS=True, ASM=kernels.inline_asm(), ROWS_T=t.block_n // 8)


def _word_aligned(x2: torch.Tensor) -> torch.Tensor:
    """x2 (M, K), or an aligned copy of it (the same values): the word path reads 16- and
    32-bit activations as 32-bit words, so its rows must start on 4-byte boundaries."""
    misaligned = x2.data_ptr() % 4 or (x2.shape[0] > 1 and x2.stride(0) * x2.element_size() % 4)
    return x2.clone(memory_format=torch.contiguous_format) if misaligned else x2


def _path_tiles(t: GGUFTiles, w: torch.Tensor, btype: BlockType, k: int, byte_tiles) -> GGUFTiles:
    """`t`, or `byte_tiles()` where `t` is a word tile that `w` does not allow."""
    if t.words and (t.block_n % 8 or t.subs % (8 * t.num_warps) or t.subs & (t.subs - 1)):
        raise ValueError(f"gguf: a word tile is 8k rows, 2^j super-blocks a warp: {t}")
    return byte_tiles() if t.words and not words_allowed(w, btype, k) else t


def _down_tiles(btype2: BlockType, w2, inter: int, t2: GGUFTiles, byte_tiles) -> GGUFTiles:
    """The down GEMV's default tile where w2's block type differs from w13's (a Q4_K_M
    file's Q6_K `ffn_down_exps`): w2's type's word tile where it has one, its switch is on
    and w2 allows it; else `t2` (w13's down tile), or `byte_tiles()` for a word tile (w13's
    word tiles are for w13's type)."""
    if _words_on(btype2) and btype2.name in _WORDS_GEMV and words_allowed(w2, btype2, inter):
        word = _WORDS_GEMV[btype2.name]
        return word.down or word
    return byte_tiles() if t2.words else t2


def grouped_tiles(num_pairs: int, dtype: torch.dtype, btype: BlockType | None = None) -> GGUFTiles:
    """MoE prefill. At many rows, 2048 tokens of the Qwen3-30B-A3B shape on the H200
    (bench_gguf_kernels.py --sweep): Q4_K 4 warps, 2,843 vs 3,156 µs (2026-12-04; 2,256 µs
    in the fifth session's run); Q8_0 4 warps and 4 blocks a step, 2,041 vs 2,326 µs (fifth
    session, best of 16 tiles). The others are not swept."""
    if dtype == torch.float32:
        return GGUFTiles(block_m=32, block_n=32, subs=2, num_warps=4)
    if num_pairs <= 1024:  # few rows per expert: small M, many programs
        return GGUFTiles(block_m=16, block_n=64, subs=4, num_warps=4)
    return _SWEPT_GROUPED.get(btype.name if btype else "", GGUFTiles(64, 64, 2, num_warps=8))


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _check_raw(w: torch.Tensor, btype: BlockType, rows: int, k: int, what: str) -> None:
    if w.dtype != torch.uint8 or w.shape[-2:] != (rows, btype.row_bytes(k)):
        raise ValueError(
            f"{what}: expected {btype.name} rows uint8 (..., {rows}, {btype.row_bytes(k)}), "
            f"got {w.dtype} {tuple(w.shape)}"
        )
    if w.stride(-1) != 1:
        raise ValueError(f"{what}: block rows must be contiguous in their last dim")


def dequantize(
    w: torch.Tensor,
    btype: BlockType,
    k: int,
    out: torch.Tensor,
    first: int = 0,
    ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Experts first .. first + len(out) of the block rows `w` (E, N, row bytes) → `out`
    (count, N, K), contiguous rows, in its dtype (the twin's float32 weights rounded once);
    given `ids` (int32, contiguous), experts ids[first + j] → out[j] instead, a negative id
    skipped (its rows of `out` left as they are)."""
    count, n = out.shape[0], out.shape[1]
    if count == 0 or n == 0 or k == 0:
        return out
    grid = (triton.cdiv(n, DEQUANT_BLOCK_N), triton.cdiv(k, DEQUANT_SUBS * 32), count)
    deq_jit.gguf_dequant_kernel[grid](
        w, ids if ids is not None else w, out,
        first, n, k,
        w.stride(0), w.stride(1), out.stride(0), out.stride(1),
        BTYPE=btype.type_id, GATHER=ids is not None, BLOCK_N=DEQUANT_BLOCK_N,
        SUBS=DEQUANT_SUBS, num_warps=4, enable_fp_fusion=False,  # the twin's roundings
    )  # fmt: skip
    return out


def dequantize_weight(w: torch.Tensor, btype: BlockType, k: int, dtype: torch.dtype):
    """One weight's block rows (N, row bytes) → its dense (N, K) copy in `dtype`."""
    out = torch.empty(1, w.shape[0], k, dtype=dtype, device=w.device)
    return dequantize(w.unsqueeze(0), btype, k, out)[0]


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    btype: BlockType,
    bias: torch.Tensor | None,
    n: int,
    k: int,
    tiles: GGUFTiles | None = None,
    dequant: bool | None = None,
) -> torch.Tensor:
    """x (..., K) @ W^T (+ bias) in x's dtype; W (N, K) stored as `btype` blocks (N, row bytes).
    `dequant`: whether to dequantize W and run `kernels.linear` (default: from
    PREFILL_MIN_ROWS rows); `tiles`: the in-register kernel's."""
    _check_raw(w, btype, n, k, "gguf linear")
    if x.dtype not in _DTYPES or x.shape[-1] != k:
        raise ValueError(f"gguf linear: x {x.dtype} {tuple(x.shape)} for K={k}")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m >= quant_launch.PREFILL_MIN_ROWS if dequant is None else dequant:
        return _dequantized_linear(x2, w, btype, bias, n, k).view(*x.shape[:-1], n)
    if Q8X_LINEAR and tiles is None and m <= DECODE_M and q8x.supports_linear(btype, w, k):
        return q8x.linear(x2, w, btype, bias, n).view(*x.shape[:-1], n)
    out = x.new_empty(m, n)
    if m == 0:
        return out.view(*x.shape[:-1], n)
    t = _path_tiles(tiles or linear_tiles(m, x.dtype, btype, n), w, btype, k,
                    lambda: linear_tiles(m, x.dtype, btype, n, words=False))  # fmt: skip
    if t.block_m in (1, 4):
        if m > DECODE_M:
            raise ValueError(f"gguf linear: the GEMV tiles take at most {DECODE_M} rows")
        _gemv_linear(_word_aligned(x2) if t.words else x2, w, btype, bias, out, t)
        return out.view(*x.shape[:-1], n)
    sk, grid = _split(x2, out, t, bias)
    jit.gguf_linear_kernel[grid](
        x2, w, sk.bias(bias, x2), sk.part, out, sk.counters,
        m, n, k, sk.k_per_split,
        x2.stride(0), w.stride(0), *sk.part_strides, out.stride(0),
        BTYPE=btype.type_id, HAS_BIAS=sk.fuse_bias,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, SUBS=t.subs,
        DOT_PRECISION=_precision(x.dtype), REDUCE=sk.reduce, num_warps=t.num_warps,
        num_stages=t.num_stages,
    )  # fmt: skip
    sk.finish(bias, out)
    return out.view(*x.shape[:-1], n)


def _split(x2, out, t: GGUFTiles, bias) -> tuple[gemv_launch.SplitK, tuple[int, int, int]]:
    """The split-K plan and grid (row programs, N tiles, splits) of a decode linear."""
    (m, k), n = x2.shape, out.shape[1]
    n_tiles = triton.cdiv(n, t.block_n)
    k_per_split, splits = decode_split(m, n_tiles, k, t)
    m_programs = triton.cdiv(m, t.block_m)
    sk = gemv_launch.SplitK.plan(out, k_per_split, splits, m_programs * n_tiles, bias is not None)
    return sk, (m_programs, n_tiles, splits)


def _gemv_linear(x2, w, btype: BlockType, bias, out, t: GGUFTiles) -> None:
    """out (M, N) = x2 @ W^T (+ bias) in the GEMV form: `gguf_linear_gemv_kernel` (block_m
    1: grid (M, N tiles, splits)) or `gguf_linear_rows_kernel` (block_m 4: four rows a
    program, each tile decoded once for them); K split from the shape alone."""
    (m, k), n = x2.shape, out.shape[1]
    sk, grid = _split(x2, out, t, bias)
    args = (
        x2, w, sk.bias(bias, x2), sk.part, out, sk.counters,
        m, n, k, sk.k_per_split,
        x2.stride(0), w.stride(0), *sk.part_strides, out.stride(0),
    )  # fmt: skip
    consts = dict(BTYPE=btype.type_id, HAS_BIAS=sk.fuse_bias, BLOCK_N=t.block_n, SUBS=t.subs,
                  REDUCE=sk.reduce, num_warps=t.num_warps, **pdl.options(x2))  # fmt: skip
    if t.words:  # the four-row kernel's word path, one build for every row count
        if t.block_m != 4:
            raise ValueError(f"gguf linear: the word tiles (Q4_K, Q6_K, Q8_0) are four-row: {t}")
        jit.gguf_linear_rows_kernel[grid](*args, **consts, **_words_consts(t))
    elif t.block_m == 1:
        jit.gguf_linear_gemv_kernel[grid](*args, **consts)
    else:
        jit.gguf_linear_rows_kernel[grid](*args, **consts)
    sk.finish(bias, out)


def _dequantized_linear(x2, w, btype: BlockType, bias, n: int, k: int) -> torch.Tensor:
    """x2 (M, K) @ W^T (+ bias) with W dequantized to x2's dtype, at most
    quant_prefill.CHUNK_BYTES of it at a time (an LM head of 151,936 x 2048 would be a 622
    MB copy): whole-weight `kernels.linear` where it fits, else column blocks of the output.
    Column blocks are cuBLAS calls of their own shape, whose kernel choice (so bits) may
    differ from one whole-weight F.linear: equal to the twin within rounding, not bit for bit;
    the same on every engine path (the blocks depend on the shapes only)."""
    row_bytes = k * x2.element_size()
    rows = max(128, quant_prefill.CHUNK_BYTES // row_bytes // 128 * 128)
    if rows >= n:
        return kernels.linear(x2, dequantize_weight(w, btype, k, x2.dtype), bias)
    out = x2.new_empty(x2.shape[0], n)
    dense = x2.new_empty(1, rows, k)
    for n0 in range(0, n, rows):
        part = dense[:, : min(rows, n - n0)]
        dequantize(w[n0 : n0 + part.shape[1]].unsqueeze(0), btype, k, part)
        b = None if bias is None else bias[n0 : n0 + part.shape[1]]
        out[:, n0 : n0 + part.shape[1]] = kernels.linear(x2, part[0], b)
    return out


def moe_merge_key(num_pairs: int, hidden: torch.Tensor) -> object | None:
    """The merge key of the GGUF block types: `quant_prefill`'s from PREFILL_MIN_PAIRS."""
    return quant_prefill.moe_merge_key(num_pairs, hidden, PREFILL_MIN_PAIRS)


def decode_split(m: int, n_tiles: int, k: int, t: GGUFTiles) -> tuple[int, int]:
    """(K per split, splits) of a linear (`gemv_launch.decode_split`), in whole chunks of
    SUBS * 32 sub-blocks (word tiles: of super-blocks, their last step's warps past the
    split idle)."""
    chunk = 256 if t.words else t.subs * 32
    return gemv_launch.decode_split(m, n_tiles, k, chunk, t.split_programs)


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    btype13: BlockType,
    w2: torch.Tensor,
    btype2: BlockType,
    inter: int,
    use_gemv: bool | None = None,
    tiles: GGUFTiles | None = None,
    dequant: bool | None = None,
    max_ids: int | None = None,
    config: moe_launch.MoeConfig | None = None,
) -> torch.Tensor:
    """Routed experts: w13 (N, 2I, row bytes) in `btype13`, w2 (N, H, row bytes) in `btype2`,
    N experts or slots that `topk_ids` (T, k) index; weights float32 (T, k) → (T, H).
    `use_gemv` (default: at most MAX_GEMV_PAIRS pairs) or else the grouped path, there
    `dequant` (default from PREFILL_MIN_PAIRS pairs) the dequantized experts in the bf16
    grouped GEMMs (tiles `config`, default `grouped_config`) or the in-register ones
    (`tiles`). `max_ids`: at most this many distinct ids in `topk_ids` (an offloaded layer's
    E on its slot view: `quant_prefill.id_bound`, `moe_align.align_pairs`)."""
    if hidden.dim() != 2 or topk_ids.shape != topk_weights.shape:
        raise ValueError("gguf fused_moe: expected hidden (T, H) and topk_ids/weights (T, k)")
    if hidden.dtype not in _DTYPES or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError("gguf fused_moe: hidden must be bf16/fp16/fp32, one row per token")
    num_tokens, top_k = topk_ids.shape
    hidden_dim = hidden.shape[1]
    _check_raw(w13, btype13, 2 * inter, hidden_dim, "gguf fused_moe w13")
    _check_raw(w2, btype2, hidden_dim, inter, "gguf fused_moe w2")
    if w13.shape[0] != w2.shape[0]:
        raise ValueError(f"gguf fused_moe: w13 {tuple(w13.shape)} / w2 {tuple(w2.shape)} ids")
    num_pairs = num_tokens * top_k
    if use_gemv is None:
        use_gemv = num_pairs <= moe_launch.MAX_GEMV_PAIRS
    if use_gemv and Q8X_MOE and tiles is None and q8x.supports(btype13, btype2, w13, w2, inter):
        return q8x.fused_moe(hidden, topk_ids, topk_weights, w13, btype13, w2, btype2, inter)
    if dequant is None:
        dequant = num_pairs >= PREFILL_MIN_PAIRS
    if not use_gemv and dequant:

        def deq13(out, first, ids):
            dequantize(w13, btype13, hidden_dim, out, first, ids)

        def deq2(out, first, ids):
            dequantize(w2, btype2, inter, out, first, ids)

        return quant_prefill.fused_moe_with(
            hidden, topk_ids, topk_weights, w13.shape[0], inter, deq13, deq2, config,
            max_ids=max_ids,
        )  # fmt: skip
    hidden, topk_ids, topk_weights, out = moe_launch.moe_inputs(hidden, topk_ids, topk_weights)
    if num_pairs == 0:
        return out
    inter_buf = hidden.new_empty(num_pairs, inter)  # (T*k, I)
    y = hidden.new_empty(num_pairs, hidden_dim)  # (T*k, H) unweighted expert outputs
    s13 = (w13.stride(0), w13.stride(1))
    s2 = (w2.stride(0), w2.stride(1))
    if use_gemv:
        # gate/up and down each on the word path where its weights allow it (`q4k_words`),
        # else on the byte tile of w13's type (as before the word path)
        t = tiles or gemv_tiles(hidden.dtype, btype13)
        byte = lambda: gemv_tiles(hidden.dtype, btype13, words=False)  # noqa: E731
        t13 = _path_tiles(t, w13, btype13, hidden_dim, byte)
        t2 = _path_tiles(t.down or t, w2, btype2, inter, byte)
        if tiles is None and btype2.name != btype13.name:  # w2's own word tile, if any
            t2 = _down_tiles(btype2, w2, inter, t2, byte)
        if t13.words:
            hidden = _word_aligned(hidden)
        jit.gguf_moe_gate_up_gemv_kernel[(num_pairs, triton.cdiv(inter, t13.block_n))](
            hidden, topk_ids, w13, inter_buf, hidden_dim, inter,
            hidden.stride(0), *s13, inter_buf.stride(0),
            BTYPE=btype13.type_id, TOP_K=top_k, BLOCK_N=t13.block_n, SUBS=t13.subs,
            num_warps=t13.num_warps, **_words_consts(t13), **pdl.options(hidden),
        )  # fmt: skip
        counters, fused = moe_launch.combine_tail(out, t2.block_n)
        jit.gguf_moe_down_gemv_kernel[(num_pairs, triton.cdiv(hidden_dim, t2.block_n))](
            inter_buf, topk_ids, w2, y, topk_weights, out, counters, hidden_dim, inter,
            inter_buf.stride(0), *s2, y.stride(0), out.stride(0),
            BTYPE=btype2.type_id, BLOCK_N=t2.block_n, SUBS=t2.subs, TOP_K=top_k,
            COMBINE=fused, num_warps=t2.num_warps, **_words_consts(t2), **pdl.options(hidden),
        )  # fmt: skip
    else:
        fused = False
        t = tiles or grouped_tiles(num_pairs, hidden.dtype, btype13)
        sorted_pairs, block_ids, num_rows = moe_align.align_pairs(
            topk_ids, w13.shape[0], t.block_m, max_ids=max_ids
        )
        common = dict(
            BLOCK_M=t.block_m, BLOCK_N=t.block_n, SUBS=t.subs,
            DOT_PRECISION=_precision(hidden.dtype), num_warps=t.num_warps,
            num_stages=t.num_stages,
        )  # fmt: skip
        jit.gguf_moe_gate_up_grouped_kernel[(block_ids.numel() * triton.cdiv(inter, t.block_n),)](
            hidden, sorted_pairs, block_ids, num_rows, w13, inter_buf,
            num_pairs, hidden_dim, inter,
            hidden.stride(0), *s13, inter_buf.stride(0),
            BTYPE=btype13.type_id, TOP_K=top_k, **common,
        )  # fmt: skip
        grid = (block_ids.numel() * triton.cdiv(hidden_dim, t.block_n),)
        jit.gguf_moe_down_grouped_kernel[grid](
            inter_buf, sorted_pairs, block_ids, num_rows, w2, y,
            num_pairs, hidden_dim, inter,
            inter_buf.stride(0), *s2, y.stride(0),
            BTYPE=btype2.type_id, **common,
        )  # fmt: skip
    if not fused:
        moe_launch._combine(y, topk_weights, out, top_k)
    return out
