"""Compile cases with programmatic dependent launch on (`xinfer.kernels.pdl`): the decode
kernels that take it, each compiled with USE_PDL and `launch_pdl` as a launch on an sm_90
GPU would have them (on CPU tensors `pdl.options` gives nothing, so it is forced here)."""

from __future__ import annotations

from unittest import mock

from compile_cases import dense, quantized  # noqa: F401 (their cases first: variants of them)
from compile_cases.base import add_variants

# one case of each kernel that starts with `wait_for_producers`, in the forms decode runs
WITH_PDL = (
    "gemv-bf16-n2048-k4096-m16-m1-bias",  # split-K, the tail in the last split
    "gemv-bf16-split-m1-bias-reduce-apart",
    "attn-decode-bf16-hd128-g4",
    "attn-decode-bf16-hd128-g4-merged",
    "rms_norm-bf16-2048-residual",
    "qkv_prep-bf16-hd256-decode",
    "moe-bf16-gemv-t1",
    "route_topk-bf16-e128-k8-renorm",
    "router_topk-bf16-e128-k2048-m1",
    "quant-fp8-block128-linear-bf16-m1",
    "quant-gptq-g128-sym-linear-bf16-m1",
    "quant-gptq-g128-sym-linear-bf16-m1-pruned",
    "quant-gptq-g128-sym-moe-bf16-gemv",
    "quant-nvfp4-moe-bf16-gemv-joined",
    "gguf-Q8_0-linear-bf16-m1",
    "gguf-Q4_0-moe-bf16-gemv",
)


def _with_pdl(run) -> None:
    from xinfer.kernels import pdl

    with mock.patch.object(pdl, "options", lambda t: {"USE_PDL": True, "launch_pdl": True}):
        run()


add_variants(WITH_PDL, "pdl", _with_pdl, "PDL")
