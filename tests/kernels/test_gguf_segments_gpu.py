"""GPU: a Q4_K_M qkv kept as GGUF segments (`quant/gguf_segments.py`: Q4_K q|k above Q6_K v)
at Qwen3-30B-A3B's shape (4608 + 512 rows, K 2048), compiled for the device: the one decode
launch (`triton/gguf_segments.py`) gives each segment's rows the bits of that type's word
linear alone (with the same K split), a row's bits do not depend on the batch (1..16 rows),
it is within the twin's tolerance with and without bias, and a CUDA graph replays it."""

from __future__ import annotations

import dataclasses

import gguf_files as gf
import pytest
import torch
from cuda_graphs import capture_after_warmup

from xinfer.kernels import gguf_launch as gl
from xinfer.kernels import gguf_segments_launch as gsl
from xinfer.kernels import gguf_tiles as gt
from xinfer.quant.gguf_formats import GGUFFormat
from xinfer.quant.gguf_segments import GGUFSegmentsFormat

pytestmark = pytest.mark.gpu
DEV = "cuda"
QWEN3_QKV = ((4608, 512), 2048)  # (q|k rows in Q4_K, v rows in Q6_K), K


@pytest.fixture(autouse=True)
def words_on(monkeypatch):
    monkeypatch.setattr(gt, "Q4K_WORDS", True)
    monkeypatch.setattr(gt, "Q6K_WORDS", True)


def _case(rows: tuple[int, int], k: int, seed: int):
    fmt = GGUFSegmentsFormat((("Q4_K", rows[0]), ("Q6_K", rows[1])))
    tensors = {
        f"weight{i}": gf.random_block_rows(t, r, k, seed + i, device=DEV)
        for i, (t, r) in enumerate(fmt.segments)
    }
    g = torch.Generator(device=DEV).manual_seed(seed + 5)
    x = (torch.randn(16, k, device=DEV, generator=g) * 0.5).to(torch.bfloat16)
    bias = torch.randn(sum(rows), device=DEV, generator=g).to(torch.bfloat16)
    return fmt, tensors, x, bias


def _close(out: torch.Tensor, ref: torch.Tensor, tol: float = 2e-2) -> None:
    scale = ref.float().abs().max()
    torch.testing.assert_close(out.float() / scale, ref.float() / scale, rtol=0, atol=tol)


def _single(fmt, tensors, x, bias, k: int, t: gt.GGUFTiles) -> torch.Tensor:
    """Each segment's word linear alone on tile `t` (its K split the one launch's), joined."""
    outs, first = [], 0
    for i, (name, rows) in enumerate(fmt.segments):
        b = None if bias is None else bias[first : first + rows]
        w = tensors[f"weight{i}"]
        outs.append(gl.linear(x, w, GGUFFormat(name).btype, b, rows, k, tiles=t))
        first += rows
    return torch.cat(outs, dim=-1)


@pytest.mark.parametrize("has_bias", [True, False])
@pytest.mark.parametrize(
    "rows,k",
    [
        QWEN3_QKV,  # one split (320 row tiles); each segment alone told not to split either
        ((64, 32), 4096),  # 6 row tiles: K split in 8 (as each segment's 4 and 2 tiles are)
    ],
)
def test_one_launch_has_the_single_type_bits_and_keeps_row_bits(rows, k, has_bias) -> None:
    fmt, tensors, x, bias = _case(rows, k, seed=90)
    bias = bias if has_bias else None
    n = sum(rows)
    ws = [tensors["weight0"], tensors["weight1"]]
    t = gsl.segment_tiles(16, x.dtype, ws, fmt.btypes, fmt.rows, k)
    assert t is not None, "the one launch must run on Qwen3's qkv segments"
    split = gt.decode_split(16, -(-n // t.block_n), k, t)
    if split[1] == 1:
        t = dataclasses.replace(t, split_programs=0)  # the segments alone: no split either
    else:
        assert all(gt.decode_split(16, -(-r // t.block_n), k, t) == split for r in rows)
    run = lambda m: fmt.triton_linear(x[:m], tensors, bias, n, k)  # noqa: E731
    full = run(16)
    for m in (1, 3, 4, 8, 16):
        assert torch.equal(_single(fmt, tensors, x[:m], bias, k, t), full[:m])
    for m in (1, 3, 8):
        assert torch.equal(run(m), full[:m])
    _close(full, fmt.reference_linear(x, tensors, bias, n, k))


def test_prefill_is_one_matmul_on_the_dequantized_segments() -> None:
    """From PREFILL_MIN_ROWS rows: the segments dequantized into one bf16 weight (the twin's
    bits), one `kernels.linear`: the twin's output."""
    (rows, k), seed = QWEN3_QKV, 93
    fmt, tensors, _, bias = _case(rows, k, seed)
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(200, k, device=DEV, generator=g).to(torch.bfloat16)
    out = fmt.triton_linear(x, tensors, bias, sum(rows), k)
    _close(out, fmt.reference_linear(x, tensors, bias, sum(rows), k), tol=1e-2)


def test_graph_replays_the_one_launch() -> None:
    """One row's qkv captured in a CUDA graph, replayed on new values of its input in the
    same buffer, gives what an eager call gives (split-K counters back at zero: the small
    case splits K)."""
    for (rows, k), seed in ((QWEN3_QKV, 94), (((64, 32), 4096), 95)):
        fmt, tensors, x, bias = _case(rows, k, seed)
        x1 = x[:1].clone()
        run = lambda: fmt.triton_linear(x1, tensors, bias, sum(rows), k)  # noqa: E731, B023
        eager = run()
        graph, captured = capture_after_warmup(run)
        x1.mul_(1.5)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, run())
        assert not torch.equal(eager, captured)
        graph.replay()  # twice: the counters were left at zero
        torch.cuda.synchronize()
        assert torch.equal(captured, run())
