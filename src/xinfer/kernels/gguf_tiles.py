"""Which tile and path a GGUF block call takes — this module's one concern; `gguf_launch`
launches the kernels with what it chooses. The tiles of the linears (`linear_tiles`: the
decode GEMV form, the LM-head tiles, the dot tiles of more rows), of the MoE GEMVs
(`gemv_tiles`, `down_tiles`) and of the in-register grouped GEMMs (`grouped_tiles`), with
the tables and the measurements they were chosen by; a decode linear's split-K
(`decode_split`); and the word paths of Q4_K, Q6_K and Q8_0: their switches (Q4K_WORDS,
Q6K_WORDS, Q80_WORDS: read here, so patched here, not on `gguf_launch`), whether a weight
allows them (`q4k_words`, `q6k_words`, `q80_words`, `words_allowed`), the byte tile where it
does not (`path_tiles`) and a word tile's constexprs (`words_consts`).

Every choice here depends only on shapes, dtypes, block types, strides and alignment, never
on ids or on the batch within an M bucket (`gguf_launch`'s notes on determinism)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xinfer import kernels
from xinfer.kernels import gemv_launch, quant_launch
from xinfer.quant.gguf_blocks import BlockType

DECODE_M = gemv_launch.DECODE_ROWS  # linears with at most this many rows: one 16-row tile
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
    # the Q4_K word path (Q4K_WORDS; `q4k_words`, `words_consts`): block_n a multiple of 8,
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
# The Q4_K head on the word path (Q4K_WORDS; `path_tiles` falls back to _SWEPT_HEAD where
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
    `down_tiles`)."""
    del dtype
    name = btype.name if btype else ""
    if (_words_on(btype) if words is None else words) and name in _WORDS_GEMV:
        return _WORDS_GEMV[name]
    return _SWEPT_GEMV.get(name, GGUFTiles(1, 8, 8, num_warps=4))


# The Q4_K word path's tiles (`words_consts`), chosen by sm_90 SASS (`bench/sass_report.py
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
for _table in (_WORDS_GEMV, _WORDS_LINEAR, _WORDS_HEAD):  # taken as Q6_K's (above)
    _table["Q8_0"] = _table["Q6_K"]


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


def words_consts(t: GGUFTiles) -> dict:
    """The word path's constexprs of tile `t` (none for a byte tile): a warp's lanes hold 8
    rows x the 4 pairs of a super-block, its warps a super-block each (subs / 8 super-blocks
    a step, a multiple of num_warps: K split between them, summed once at the end; more than
    one a warp sit in its registers); each thread holds ROWS_T = block_n / 8 rows in its
    registers, so the activations it loads and converts serve that many rows."""
    if not t.words:
        return {}
    return dict(WORDS=True, ASM=kernels.inline_asm(), ROWS_T=t.block_n // 8)


def path_tiles(t: GGUFTiles, w: torch.Tensor, btype: BlockType, k: int, byte_tiles) -> GGUFTiles:
    """`t`, or `byte_tiles()` where `t` is a word tile that `w` does not allow."""
    if t.words and (t.block_n % 8 or t.subs % (8 * t.num_warps) or t.subs & (t.subs - 1)):
        raise ValueError(f"gguf: a word tile is 8k rows, 2^j super-blocks a warp: {t}")
    return byte_tiles() if t.words and not words_allowed(w, btype, k) else t


def down_tiles(btype2: BlockType, w2, inter: int, t2: GGUFTiles, byte_tiles) -> GGUFTiles:
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


def decode_split(m: int, n_tiles: int, k: int, t: GGUFTiles) -> tuple[int, int]:
    """(K per split, splits) of a linear (`gemv_launch.decode_split`), in whole chunks of
    SUBS * 32 sub-blocks (word tiles: of super-blocks, their last step's warps past the
    split idle)."""
    chunk = 256 if t.words else t.subs * 32
    return gemv_launch.decode_split(m, n_tiles, k, chunk, t.split_programs)
