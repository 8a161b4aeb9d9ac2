"""A merged linear of two GGUF block types kept as segments (`quant/gguf_segments.py`, a
Q4_K_M file's Q4_K q|k above its Q6_K v): the format's layout, loader views and twin on the
CPU; and, run by Triton's CPU interpreter, the one-launch decode kernel
(`triton/gguf_segments.py`) bit for bit the single-type word linear on each segment's rows
(bias, K split, 1..6 rows), a row's bits alike alone and in the batch, within the word
path's tolerance of the twin; the per-segment route where the one launch may not run, and
the dequantized route of prefill-sized calls."""

from __future__ import annotations

import pytest
import torch
from gguf_interpret_cases import (
    assert_close_scaled,
    assert_close_words,
    block_rows,
    offset_copy,
)
from interpreter_child import child_only, interpreter_child_test, require_interpreted

from xinfer.errors import UserError
from xinfer.quant.gguf_formats import GGUFFormat
from xinfer.quant.gguf_segments import GGUFSegmentsFormat, runs

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(scope="module")
def gsl(gl):
    """`kernels.gguf_segments_launch`, its kernel running interpreted."""
    from xinfer.kernels import gguf_segments_launch
    from xinfer.kernels.triton import gguf_segments

    require_interpreted(gguf_segments.gguf_linear_segments_kernel)
    return gguf_segments_launch


@pytest.fixture(autouse=True)
def words_on(monkeypatch):
    """The Q4_K and Q6_K word paths on (the defaults; the switch tests turn one off)."""
    from xinfer.kernels import gguf_tiles

    monkeypatch.setattr(gguf_tiles, "Q4K_WORDS", True)
    monkeypatch.setattr(gguf_tiles, "Q6K_WORDS", True)


def _case(rows: tuple[int, int], k: int, seed: int, types=("Q4_K", "Q6_K")):
    """The segments' block rows (fresh allocations: aligned for words) and their format."""
    fmt = GGUFSegmentsFormat(tuple(zip(types, rows)))
    tensors = {f"weight{i}": block_rows(t, r, k, seed=seed + i).clone()
               for i, (t, r) in enumerate(fmt.segments)}  # fmt: skip
    return fmt, tensors


# --- the format (no kernels) ------------------------------------------------------------------


def test_segments_are_the_runs_of_one_type_in_part_order() -> None:
    assert runs(["Q4_K", "Q4_K", "Q6_K"]) == [("Q4_K", 2), ("Q6_K", 1)]
    assert runs(["Q4_K", "Q8_0", "Q4_K"]) == [("Q4_K", 1), ("Q8_0", 1), ("Q4_K", 1)]
    fmt = GGUFSegmentsFormat.from_parts([("Q4_K", 4096), ("Q4_K", 512), ("Q6_K", 512)])
    assert fmt.segments == (("Q4_K", 4608), ("Q6_K", 512)) and fmt.name == "gguf-q4_k|q6_k"
    specs = fmt.tensor_specs(5120, 2048)
    assert {n: (s.shape, s.dtype) for n, s in specs.items()} == {
        "weight0": ((4608, 1152), torch.uint8),
        "weight1": ((512, 1680), torch.uint8),
    }
    # 5120 x 2048 of bf16 (20 MiB) against 5.9 MiB of blocks: Qwen3-30B-A3B's qkv
    assert fmt.weight_bytes(5120, 2048) == 4608 * 1152 + 512 * 1680
    with pytest.raises(ValueError):
        fmt.tensor_specs(5000, 2048)
    for bad in ((("Q4_K", 8),), (("Q4_K", 8), ("Q4_K", 8)), (("Q4_K", 8), ("F16", 8))):
        with pytest.raises(ValueError):
            GGUFSegmentsFormat(bad)


def test_a_part_fills_its_rows_of_its_segment() -> None:
    """`part_views`: q, k and v of a 64 + 32 | 32 merge → the part's own GGUF type and its
    rows of its segment's tensor; a part across segments is refused."""
    fmt = GGUFSegmentsFormat.from_parts([("Q4_K", 64), ("Q4_K", 32), ("Q6_K", 32)])
    tensors = {
        n: torch.zeros(s.shape, dtype=s.dtype) for n, s in fmt.tensor_specs(128, 256).items()
    }
    part_fmt, views = fmt.part_views(tensors, 128, 256, 64, 32, "k")
    assert part_fmt == GGUFFormat("Q4_K") and set(views) == {"weight"}
    views["weight"].fill_(7)
    assert tensors["weight0"][64:].eq(7).all() and tensors["weight0"][:64].eq(0).all()
    part_fmt, views = fmt.part_views(tensors, 128, 256, 96, 32, "v")
    assert part_fmt == GGUFFormat("Q6_K") and views["weight"].shape == (32, 210)
    assert views["weight"].data_ptr() == tensors["weight1"].data_ptr()
    with pytest.raises(UserError, match="across"):
        fmt.part_views(tensors, 128, 256, 64, 64, "k|v")


def test_twin_is_the_segments_stacked() -> None:
    """`dequantize`: each segment's rows by its own type's twin, stacked; `engine_tensors`
    (quantize, convert) round-trips through the segments."""
    fmt, tensors = _case((32, 16), 512, seed=70)
    q4, q6 = GGUFFormat("Q4_K"), GGUFFormat("Q6_K")
    want = torch.cat([q4.dequantize({"weight": tensors["weight0"]}, 32, 512),
                      q6.dequantize({"weight": tensors["weight1"]}, 16, 512)])  # fmt: skip
    assert torch.equal(fmt.dequantize(tensors, 48, 512), want)
    w = torch.randn(48, 512, generator=torch.Generator().manual_seed(70)) * 0.05
    again = fmt.engine_tensors(w)
    assert set(again) == {"weight0", "weight1"}
    assert torch.equal(again["weight0"], GGUFFormat("Q4_K").quantize(w[:32])["weight"])
    assert torch.equal(again["weight1"], GGUFFormat("Q6_K").quantize(w[32:])["weight"])
    torch.testing.assert_close(fmt.dequantize(again, 48, 512), w, rtol=0, atol=0.02)


# --- the kernels (interpreted) ----------------------------------------------------------------


def _single(gl, fmt, tensors, x, bias, k: int) -> torch.Tensor:
    """The single-type linear of each segment on its rows (its own launch), joined."""
    outs, first = [], 0
    for i, (t, rows) in enumerate(fmt.segments):
        b = None if bias is None else bias[first : first + rows]
        outs.append(gl.linear(x, tensors[f"weight{i}"], GGUFFormat(t).btype, b, rows, k))
        first += rows
    return torch.cat(outs, dim=-1)


@child_only
@pytest.mark.parametrize(
    "rows,k,m,dtype,has_bias",
    [
        # K = 5 super-blocks split 3 + 2 (the whole weight's 4 row tiles and each segment's
        # 2 give one split), v's 19 rows a tail of its second tile, bias added once
        ((32, 19), 1280, 4, torch.float32, True),
        ((16, 32), 512, 3, torch.bfloat16, False),  # bf16 activations as 32-bit words
        ((48, 16), 512, 1, torch.float16, True),  # one row: the same four-row build
        ((32, 16), 256, 6, torch.float32, True),  # two row programs, the second of two rows
    ],
)
def test_one_launch_has_the_single_type_bits_and_keeps_row_bits(
    gl, gsl, monkeypatch, rows, k, m, dtype, has_bias
) -> None:
    """The one launch (no per-segment call made) gives each segment's rows the bits of that
    type's word linear alone; each row the same bits alone and in the batch; within the word
    path's tolerance of the twin (dequantize, then matmul)."""
    from xinfer.kernels import gguf_tiles as gt

    fmt, tensors = _case(rows, k, seed=71)
    n = sum(rows)
    g = torch.Generator().manual_seed(72)
    x = (torch.randn(m, k, generator=g) * 0.1).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if has_bias else None
    ws = [tensors["weight0"], tensors["weight1"]]
    t = gsl.segment_tiles(m, dtype, ws, fmt.btypes, fmt.rows, k)
    assert t is not None and t == gt._WORDS_LINEAR["Q4_K"] == gt._WORDS_LINEAR["Q6_K"]
    split = gt.decode_split(m, -(-n // t.block_n), k, t)
    assert all(gt.decode_split(m, -(-r // t.block_n), k, t) == split for r in rows)
    if k == 1280:
        assert split == (768, 2)

    def one_launch(x_rows):
        with monkeypatch.context() as patch:  # the one launch calls no single-type linear
            patch.setattr(gsl.gguf_launch, "linear", None)
            return fmt.triton_linear(x_rows, tensors, bias, n, k)

    out = one_launch(x)
    assert out.shape == (m, n) and out.dtype == dtype
    assert torch.equal(out, _single(gl, fmt, tensors, x, bias, k))
    for r in range(m):
        assert torch.equal(one_launch(x[r : r + 1])[0], out[r])
    assert_close_words(out, fmt.reference_linear(x, tensors, bias, n, k), dtype)


@child_only
def test_where_one_launch_may_not_run_each_segment_runs_alone(gl, gsl, gt, monkeypatch) -> None:
    """A boundary inside a row tile (40 rows), a segment's rows that do not allow words (a
    copy 1 byte in), a word path switched off, three segments, or 17 rows (past the decode
    bucket): no one-launch tile; each segment through its own single-type linear, the same
    bits, within the twin's tolerance."""
    k, dtype = 512, torch.float32
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(73)) * 0.1
    fmt, tensors = _case((40, 16), k, seed=74)
    bias = torch.randn(56, generator=torch.Generator().manual_seed(75))
    ws = [tensors["weight0"], tensors["weight1"]]
    assert gsl.segment_tiles(2, dtype, ws, fmt.btypes, fmt.rows, k) is None
    out = fmt.triton_linear(x, tensors, bias, 56, k)
    assert torch.equal(out, _single(gl, fmt, tensors, x, bias, k))
    assert_close_words(out, fmt.reference_linear(x, tensors, bias, 56, k), dtype)

    fmt, tensors = _case((32, 16), k, seed=76)
    ws = [tensors["weight0"], offset_copy(tensors["weight1"], 1)]
    assert gsl.segment_tiles(2, dtype, ws, fmt.btypes, fmt.rows, k) is None
    shifted = {"weight0": ws[0], "weight1": ws[1]}
    out = fmt.triton_linear(x, shifted, None, 48, k)
    assert torch.equal(out, _single(gl, fmt, shifted, x, None, k))
    assert_close_scaled(out, fmt.reference_linear(x, tensors, None, 48, k), dtype)
    ws = [tensors["weight0"], tensors["weight1"]]
    assert gsl.segment_tiles(2, dtype, ws, fmt.btypes, fmt.rows, k) is not None
    monkeypatch.setattr(gt, "Q6K_WORDS", False)
    assert gsl.segment_tiles(2, dtype, ws, fmt.btypes, fmt.rows, k) is None
    monkeypatch.setattr(gt, "Q6K_WORDS", True)
    assert gsl.segment_tiles(17, dtype, ws, fmt.btypes, fmt.rows, k) is None

    fmt, tensors = _case((16, 16, 16), k, seed=77, types=("Q4_K", "Q6_K", "Q4_K"))
    ws = [tensors[f"weight{i}"] for i in range(3)]
    assert gsl.segment_tiles(2, dtype, ws, fmt.btypes, fmt.rows, k) is None
    out = fmt.triton_linear(x, tensors, None, 48, k)
    assert torch.equal(out, _single(gl, fmt, tensors, x, None, k))


@child_only
def test_prefill_sized_calls_dequantize_into_one_weight(gsl) -> None:
    """From PREFILL_MIN_ROWS rows (or `dequant=True`): the segments dequantized into one
    dense weight, one matmul: the twin's result (its bits on the CPU's matmul)."""
    k = 512
    fmt, tensors = _case((32, 16), k, seed=78)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(79)) * 0.1
    bias = torch.randn(48, generator=torch.Generator().manual_seed(80))
    ws = [tensors["weight0"], tensors["weight1"]]
    out = gsl.linear(x, ws, fmt.btypes, fmt.rows, bias, k, dequant=True)
    assert torch.equal(out, fmt.reference_linear(x, tensors, bias, 48, k))
