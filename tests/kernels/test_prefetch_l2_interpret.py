"""The byte ranges of the dense decode linears' L2 weight prefetch (`triton/pdl.py`
`prefetch_rows_l2`), in Triton's CPU interpreter: each launcher runs with the prefetch on
(`pdl.prefetch_options` forced, its alignment rule kept) and the prefetch instruction
replaced by a recorder of its (address, bytes) pairs. For the bf16 GEMV and the router, the
FP8 / GPTQ / NVFP4 decode linears (weights and scales) and every GGUF block type, split and
unsplit, one and several rows, N not a tile multiple:

- every prefetch lies inside one row of one of the launch's weight tensors (never past the
  row's stride, so never out of the allocation), on 16-byte addresses and sizes;
- together they cover every byte of every row the kernel reads, and reach past it only
  within the 16 bytes of rounding; no byte is prefetched by more than two distinct ranges
  (the neighbouring splits' shared block or 16 bytes);
- the outputs are the bits of the launch without it (the interpreter's prefetch does
  nothing; the GPU's: test_prefetch_l2_gpu.py).

The instruction itself (and that it comes before the PDL wait): test_prefetch_l2_compile.py.
Runs in a child pytest with TRITON_INTERPRET=1 (see interpreter_child.py)."""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)


@contextmanager
def _recorded():
    """Launches inside prefetch as an sm_90 launch with PREFETCH_WEIGHTS would (where the
    tensor is `prefetch_aligned`); yields the list of (addresses, sizes) int64 arrays, one
    pair a prefetch call of a program."""
    from xinfer.kernels import pdl
    from xinfer.kernels.triton import pdl as pdl_jit

    calls: list[tuple[np.ndarray, np.ndarray]] = []

    def record(addr, size):
        calls.append((addr.handle.data.astype(np.int64).ravel().copy(),
                      size.handle.data.astype(np.int64).ravel().copy()))  # fmt: skip

    def options(w, key="PREFETCH_L2"):
        return {key: True} if pdl.prefetch_aligned(w) else {}

    with (
        mock.patch.object(pdl_jit, "bulk_prefetch_l2", record),
        mock.patch.object(pdl, "prefetch_options", options),
    ):
        yield calls


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _check(calls, tensors: dict[str, tuple[torch.Tensor, int]]) -> None:
    """`tensors`: name → (2-D tensor, bytes of each row the kernel reads); every one must
    have been prefetched (the caller passes only those `prefetch_aligned`)."""
    ranges = {(int(a), int(s)) for addrs, sizes in calls for a, s in zip(addrs, sizes) if s > 0}
    assert ranges, "nothing prefetched"
    counts = {}
    for name, (t, _) in tensors.items():
        row_bytes = t.stride(0) * t.element_size()
        counts[name] = np.zeros(t.shape[0] * row_bytes, dtype=np.int32)
    for a, s in sorted(ranges):
        assert a % 16 == 0 and s % 16 == 0, f"prefetch {a:#x} + {s} not on 16 bytes"
        owner = [n for n, (t, _) in tensors.items() if 0 <= a - t.data_ptr() < len(counts[n])]
        assert len(owner) == 1, f"prefetch {a:#x} + {s} in none of {list(tensors)}"
        t, used = tensors[owner[0]]
        row_bytes = t.stride(0) * t.element_size()
        off = a - t.data_ptr()
        row, col = divmod(off, row_bytes)
        assert col + s <= row_bytes, f"{owner[0]} row {row}: [{col}, {col + s}) past the row"
        assert col + s <= -(-used // 16) * 16, (
            f"{owner[0]} row {row}: bytes [{col}, {col + s}) past the {used} it reads"
        )  # fmt: skip
        counts[owner[0]][off : off + s] += 1
    for name, (t, used) in tensors.items():
        row_bytes = t.stride(0) * t.element_size()
        per_row = counts[name].reshape(t.shape[0], row_bytes)
        missed = np.argwhere(per_row[:, :used] == 0)
        assert not len(missed), f"{name}: bytes read but not prefetched, first {missed[:4]}"
        assert per_row.max() <= 2, f"{name}: a byte prefetched {per_row.max()} times"


def _both(launch):
    """(output without the prefetch, output with it, the recorded calls)."""
    want = launch()
    with _recorded() as calls:
        got = launch()
    assert torch.equal(_bits(got), _bits(want)), "the prefetch changed the output"
    return calls


# --- bf16 GEMV and the router -------------------------------------------------------------


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("m", [1, 8])
def test_gemv(dtype, split_k, m) -> None:
    from xinfer.kernels import gemv_launch, pdl
    from xinfer.kernels.triton import gemv

    require_interpreted(gemv.gemv_kernel)
    g = torch.Generator().manual_seed(split_k * 10 + m)
    n, k = 40, 704  # 3 splits of 256 columns, the last short; N past two 16-row tiles
    x, w = torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype)
    cfg = gemv_launch.GemvConfig(block_n=16, block_k=64, split_k=split_k)
    assert pdl.prefetch_aligned(w)
    calls = _both(lambda: gemv_launch.linear(x, w, config=cfg))
    _check(calls, {"w": (w, k * w.element_size())})


@child_only
@pytest.mark.parametrize("m", [1, 5])
def test_router(m) -> None:
    from xinfer.kernels import gemv_launch, router_launch
    from xinfer.kernels.triton import router_topk

    require_interpreted(router_topk.router_topk_kernel)
    g = torch.Generator().manual_seed(m)
    x, w = torch.randn(m, 512, generator=g), torch.randn(60, 512, generator=g)
    tiles = gemv_launch.GemvConfig(block_n=16, block_k=64, split_k=4)
    with mock.patch.object(router_launch, "config", lambda *a: tiles):
        calls = _both(lambda: torch.cat([t.float() for t in router_launch.router_topk(
            x, w, 4, True)], dim=1))  # fmt: skip
    _check(calls, {"w": (w, 512 * 4)})


# --- the quantized formats' decode linears ----------------------------------------------


def _formats():
    from xinfer.quant.fp8 import Fp8Block
    from xinfer.quant.gptq import GptqInt4
    from xinfer.quant.nvfp4 import Nvfp4

    return {
        "fp8-block128": Fp8Block(128, 128),
        "gptq-g128-asym": GptqInt4(group_size=128, has_zero=True),
        "nvfp4": Nvfp4(),
    }


@child_only
@pytest.mark.parametrize("name", ["fp8-block128", "gptq-g128-asym", "nvfp4"])
@pytest.mark.parametrize("m,one_row", [(1, False), (1, True), (5, False)],
                         ids=["m1", "m1-one-row", "m5"])  # fmt: skip
def test_quant_linear(name, m, one_row) -> None:
    from quant_weights import random_weights

    from xinfer.kernels import quant_launch
    from xinfer.kernels.triton import quant_gemm

    require_interpreted(quant_gemm.quant_linear_rows_kernel)
    # 5 tiles of 8 rows, the last partial (GPTQ packs rows by 8: whole); K in 4 chunks of 512
    # columns (4-bit) split in two, or 8 of 256 (FP8) in four
    n, k = 40 if name.startswith("gptq") else 36, 2048
    fmt = _formats()[name]
    tensors = random_weights(fmt, n, k, seed=3)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.float16)
    tiles = None
    if one_row:  # the one-row kernel, whatever the format's choice
        tiles = quant_launch.linear_tiles(m, x.dtype, fmt.kernel_weights(tensors, k), k, fmt)
        tiles = quant_launch.QuantTiles(block_m=1, block_n=tiles.block_n, block_k=tiles.block_k,
                                        num_warps=tiles.num_warps, chunk=tiles.chunk)  # fmt: skip
    calls = _both(lambda: quant_launch.linear(x, fmt, tensors, None, n, k, tiles=tiles))
    kw = fmt.kernel_weights(tensors, k)
    w_used = k if kw.fmt_code == 1 else k // 2
    s_used = kw.s.shape[1] * kw.s.element_size()
    _check(calls, {"w": (kw.w, w_used), "s": (kw.s, s_used)})


# --- GGUF block types -------------------------------------------------------------------


GGUF = ["Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]


@child_only
@pytest.mark.parametrize("name", GGUF)
@pytest.mark.parametrize("m,rows", [(1, 0), (3, 1), (6, 0)], ids=["m1", "m3-one-row", "m6"])
def test_gguf_linear(name, m, rows) -> None:
    import gguf_files as gf

    from xinfer.kernels import gguf_launch
    from xinfer.kernels.triton import gguf_gemm
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    require_interpreted(gguf_gemm.gguf_linear_rows_kernel)
    btype = BLOCK_TYPES[name]
    n, k = 20, 2048  # 8 super-blocks / 64 blocks: row bytes a multiple of 16 for every type
    w = gf.random_block_rows(name, n, k, seed=5).clone()  # a torch allocation: aligned
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 0.05).half()
    tiles = gguf_launch.GGUFTiles(1, 8, 8, num_warps=4) if rows else None
    calls = _both(lambda: gguf_launch.linear(x, w, btype, None, n, k, tiles))
    _check(calls, {"w": (w, btype.row_bytes(k))})
