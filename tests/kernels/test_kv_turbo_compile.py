"""The TurboQuant attention kernels' tensor-core operands as Triton compiles them for sm_90,
on CPU (`triton_compile.lower` to TTGIR: no ptxas, no GPU).

Why: on the H100 (Triton 3.6) a turbo4 engine with head_dim 16 decoded wrong tokens
(`test_kv_turbo_gpu.py::test_greedy_tokens_do_not_depend_on_the_batch`: a prompt whose last
token ran through the decode kernel after a prefix-cache hit got other tokens than in the
batch's prefill) while the interpreter and every CPU test agreed with the twin. The codes'
loader (`triton/kv_turbo.turbo_kv_rows`) unpacked the nibbles with `tl.join`; Triton 3.6's
operand-width heuristic (AccelerateMatmul `computeOrigBitWidth`) halves the loaded 8 bits
for a join in a dot operand's producers, so the decode kernel's MMAv2 dots got kWidth 8,
and an MMAv2 operand of kWidth w spans 4w elements along K: where K < 4w (q . k at head_dim
16; p . v with 16-key tiles, e.g. head_dim 256) Triton 3.6 sums the wrong elements (fixed
upstream after 3.6 by bounding kWidth with K). Checked here, whatever Triton is installed:
no `tt.join` in the turbo attention kernels, and every MMAv2 dot with 4 kWidth <= K."""

from __future__ import annotations

import re
from unittest import mock

import pytest
import torch
from interpreter_child import IS_CHILD

pytest.importorskip("triton")
from ttgir_dots import DOT_A, ttgir  # noqa: E402

from xinfer.kv import turbo  # noqa: E402
from xinfer.kv.format import TurboQuant  # noqa: E402

pytestmark = pytest.mark.skipif(
    IS_CHILD, reason="compiles the kernels: needs a process without TRITON_INTERPRET=1"
)


def _attention(bits: int, head_dim: int, decode: bool, dtype, config=None) -> None:
    from xinfer.kernels import attn_launch

    cache = turbo.allocate(TurboQuant(bits), 12, 16, 2, head_dim, dtype, "cpu")
    tables = torch.randperm(12).view(3, 4).to(torch.int32)
    seq_lens = [17, 40, 5]
    query_lens = [1, 1, 1] if decode else [17, 9, 5]
    q = torch.randn(sum(query_lens), 4, head_dim).to(dtype)
    qsl = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    with mock.patch.object(attn_launch, "SMALL_INTERPRETER_TILES", False):  # the GPU's tiles
        attn_launch.paged_attention(
            q, cache.k_codes, cache.v_codes, tables, torch.tensor(seq_lens, dtype=torch.int32),
            qsl, head_dim**-0.5, max_query_len=max(query_lens), max_seq_len=512,
            config=config, turbo=cache,
        )  # fmt: skip


@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize(
    "head_dim, decode, config",
    [
        (16, True, None),  # the tiny test models': q . k over K = 16
        (128, True, None),
        (256, True, None),  # 16-key decode tiles: p . v over K = 16
        (128, True, dict(BLOCK_N=16)),  # a 16-key turbo decode config (bench_kv_turbo block16)
        (16, False, None),
        (128, False, None),
    ],
    ids=["decode-d16", "decode-d128", "decode-d256", "decode-d128-n16", "prefill-d16",
         "prefill-d128"],
)  # fmt: skip
def test_turbo_rows_reach_the_dots_as_8_bit_codes(bits, head_dim, decode, config):
    """No `tl.join` between the codes and the dots, and every MMAv2 dot's A operand (B has
    the same kWidth) with 4 kWidth <= K: the bf16 decode kernel's dots get kWidth 4 (the
    8-bit loads), which every K of these kernels (>= 16) takes."""
    kernel = "decode_kernel" if decode else "prefill_kernel"
    text = ttgir(lambda: _attention(bits, head_dim, decode, torch.bfloat16, config))[kernel]
    assert "tt.join" not in text, f"{kernel}: a tl.join feeds the attention (see the docstring)"
    dots = DOT_A.findall(text)
    if decode:  # the decode kernel's dots are MMAv2 (M = 16 query-head rows)
        assert len(dots) == 2, f"expected q . k and p . v as MMAv2 dots, found {dots}"
    for m, k, parent, width in dots:
        assert re.search(rf"^{parent} = #ttg\.nvidia_mma<\{{versionMajor = 2", text, re.M)
        assert 4 * int(width) <= int(k), f"{kernel}: MMAv2 dot {m}x{k} with kWidth {width}"
