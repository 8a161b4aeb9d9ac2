"""Decode attention merging its splits in the decode launch — the last split of each
(sequence, KV head) to arrive (`attention._merge_when_last`, `attn_launch.FUSED_DECODE_REDUCE`)
— in Triton's CPU interpreter: the output equals, bit for bit, the two-launch path's
(`decode_reduce_kernel` in `attn_launch.reduce_splits`) for batches of one and four rows
(padding rows of length 0, lengths ending mid-split), several splits, GQA groups 1, 4 and 8,
with and without a sliding window (one that skips whole splits too), in bfloat16 and
float32; no merge launch is left; the counters are zero after each call; without counters
(a CUDA graph captured before any were made) the merge runs apart, with the same bits. (The
GPU's memory ordering is `test_decode_reduce_fused_gpu.py`'s.)

Bits are compared as integers: the interpreter's bfloat16 tl.dot is wrong (raw bits) and may
give NaN, which both paths must then give alike.

Runs in a child pytest with TRITON_INTERPRET=1 (see interpreter_child.py)."""

from __future__ import annotations

import pytest
import torch
from fused_tails import assert_counters_zero, run_switched
from interpreter_child import child_only, interpreter_child_test, require_interpreted
from paged_cases import paged_case

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)
CPU = torch.device("cpu")
SPLIT_LEN = 16  # the interpreter's BLOCK_N: one tile a split, many splits
BATCHES = {"1": [37], "1-padding": [0], "4": [1, 17, 0, 90]}  # 37, 17, 90: mid-split ends
# (Hq, Hk): GQA groups 1, 4, 8 (BLOCK_G pads every group to 16)
HEADS = {"g1": (2, 2), "g4": (8, 2), "g8": (8, 1)}
# None; 20 < seq_len - split_len: whole splits before the window; 3: within one split
WINDOWS = [None, 20, 3]


@pytest.fixture(scope="module")
def al():
    from xinfer.kernels import attn_launch

    require_interpreted(attn_launch.attn_kernels.decode_kernel)
    return attn_launch


def _decode(al, case, bound: int, window: int | None, split_len: int = SPLIT_LEN):
    return lambda: al.paged_attention(
        *case, 0.2, max_query_len=1, max_seq_len=bound, split_len=split_len,
        sliding_window=window,
    )  # fmt: skip


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _run(al, monkeypatch, call, fused: bool):
    """(output, merge launches apart) with FUSED_DECODE_REDUCE = `fused`."""
    return run_switched(al, "FUSED_DECODE_REDUCE", "reduce_splits", monkeypatch, call, fused)


@child_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("window", WINDOWS, ids=["no-window", "window20", "window3"])
def test_fused_merge_has_the_reduce_kernels_bits(al, monkeypatch, dtype, heads, batch, window):
    seq_lens = BATCHES[batch]
    case = paged_case(dtype, seq_lens, None, *HEADS[heads], seed=len(seq_lens))
    call = _decode(al, case, bound=max(max(seq_lens), 1) + 5, window=window)
    apart, launches_apart = _run(al, monkeypatch, call, fused=False)
    fused, launches_fused = _run(al, monkeypatch, call, fused=True)
    assert (launches_apart, launches_fused) == (1, 0)
    assert torch.equal(_bits(fused), _bits(apart))
    assert_counters_zero(CPU)
    for row, n in enumerate(seq_lens):
        if n == 0:  # a padding row: zeros
            assert torch.count_nonzero(fused[row]) == 0
    again, _ = _run(al, monkeypatch, call, fused=True)
    assert torch.equal(_bits(again), _bits(apart))
    assert_counters_zero(CPU)


@child_only
def test_fused_merge_matches_the_reference(al, monkeypatch) -> None:
    """A float32 batch with GQA and a window, fused, against `reference.paged_attention`
    (the bit tests compare the two paths only)."""
    from xinfer.kernels import reference

    case = paged_case(torch.float32, [1, 17, 0, 90], None, 8, 2, seed=5)
    for window in (None, 20):
        out, launches = _run(al, monkeypatch, _decode(al, case, 100, window), fused=True)
        ref = reference.paged_attention(*case, 0.2, sliding_window=window)
        assert launches == 0
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@child_only
@pytest.mark.parametrize("split_len", [16, 48])
def test_fused_merge_over_more_splits_than_a_merge_step(al, monkeypatch, split_len) -> None:
    """65 splits of 16 keys, more than REDUCE_BLOCK_S (two merge steps, a window across
    their border), and 22 splits of three tiles."""
    seq_lens = [al.REDUCE_BLOCK_S * 16 + 9, 5]
    case = paged_case(torch.float32, seq_lens, None, 4, 1, head_dim=16, block_size=32, seed=3)
    for window in (None, 100):
        call = _decode(al, case, max(seq_lens), window, split_len=split_len)
        apart, _ = _run(al, monkeypatch, call, fused=False)
        fused, launches = _run(al, monkeypatch, call, fused=True)
        assert launches == 0 and torch.equal(fused, apart)
        assert_counters_zero(CPU)


@child_only
def test_without_counters_the_merge_runs_apart(al, monkeypatch) -> None:
    """No counters (`arrivals.counters` None: a graph captured before any were made, or more
    groups than counters): the two-launch path, the fused path's bits."""
    from xinfer.kernels import arrivals

    case = paged_case(torch.bfloat16, [1, 17, 0, 90], None, 8, 2, seed=7)
    call = _decode(al, case, 95, 20)
    fused, launches = _run(al, monkeypatch, call, fused=True)
    assert launches == 0
    monkeypatch.setattr(arrivals, "counters", lambda device, groups: None)
    apart, launches = _run(al, monkeypatch, call, fused=True)
    assert launches == 1 and torch.equal(_bits(apart), _bits(fused))
    monkeypatch.undo()
    small = torch.zeros(7, dtype=torch.int32)  # 4 rows x 2 KV heads do not fit in 7
    monkeypatch.setitem(arrivals._by_lane, (CPU, arrivals.MAIN), small)
    apart, launches = _run(al, monkeypatch, call, fused=True)
    assert launches == 1 and torch.equal(_bits(apart), _bits(fused))
    assert not small.any()
