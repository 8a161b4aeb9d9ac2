"""Compile cases with the L2 weight prefetch on (`xinfer.kernels.pdl.prefetch_options`): the
dense decode linears that take it (bf16 GEMV, router with top-k, the quantized formats' and
the GGUF block types' GEMV forms), compiled with PDL and PREFETCH_WEIGHTS as a launch on an
sm_90 GPU would have them: `pdl.options` is forced (CPU tensors get none), the alignment
rule of `prefetch_options` is the real one. `test_prefetch_l2_compile.py` reads their PTX."""

from __future__ import annotations

from unittest import mock

from compile_cases import dense, quantized  # noqa: F401 (their cases first: variants of them)
from compile_cases.base import add_variants

# base case → the prefetch constexprs its launch must get (the weight's; "S" its scales')
WITH_PREFETCH = {
    "gemv-bf16-n2048-k4096-m16-m1-bias": "L2",  # split K
    "gemv-fp16-n151936-k2048-m16-m16": "L2",  # the LM head's tile, unsplit
    "router_topk-bf16-e128-k2048-m1": "L2",  # split K
    "router_topk-fp32-e8-k512-m3": "L2",  # unsplit
    "quant-fp8-block128-linear-bf16-m1": "L2 S",  # the one-row kernel
    "quant-fp8-block128-linear-fp16-m16-nobias": "L2 S",  # the four-row kernel
    "quant-fp8-per-channel-linear-bf16-m1": "L2",  # (N, 1) scales: rows of 4 bytes
    "quant-gptq-g128-sym-linear-bf16-m1-pruned": "L2 S",
    "quant-gptq-g128-asym-linear-fp16-m16-nobias": "L2 S",
    "quant-gptq-g96-sym-linear-bf16-m1": "L2 S",  # 4-bit bytes, the one-row kernel
    "quant-ct-g32-asym-bf16-linear-bf16-m1": "L2 S",
    "quant-nvfp4-linear-bf16-m1-pruned": "L2 S",
    "quant-nvfp4-linear-bf16-m2-one-row": "L2 S",
    "quant-fp8-block128-linear-bf16-m2-ragged": "L2",  # (1, 9) float32 scales: 36-byte rows
    "quant-nvfp4-linear-bf16-m2-ragged": "",  # K 1,040: rows of 520 bytes, scales of 65
    "gguf-Q8_0-linear-bf16-m1": "L2",
    "gguf-Q4_0-linear-bf16-m1": "L2",
    "gguf-Q5_0-linear-bf16-m1": "L2",
    "gguf-Q4_K-linear-bf16-m1": "L2",  # the word path
    "gguf-Q5_K-linear-bf16-m1": "L2",
    "gguf-Q4_K-linear-bf16-m3-one-row": "L2",  # the one-row kernel
    "gguf-Q4_K-linear-fp16-m16-nobias": "L2",
    "gguf-Q4_K-linear-bf16-m1-head": "L2",
    "gguf-Q6_K-linear-bf16-m1": "",  # 4 super-blocks of 210 bytes: rows not 16-byte strides
}


def with_prefetch(run, prefetch: bool = True) -> None:
    """`run` with PDL given to every launch (CPU tensors too) and PREFETCH_WEIGHTS as asked."""
    from xinfer.kernels import pdl

    with (
        mock.patch.object(pdl, "options", lambda t, **kw: {"USE_PDL": True, "launch_pdl": True}),
        mock.patch.object(pdl, "PREFETCH_WEIGHTS", prefetch),
    ):
        run()


add_variants(WITH_PREFETCH, "prefetch", with_prefetch, "prefetch")
