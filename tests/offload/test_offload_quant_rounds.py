"""An offloaded layer in a quantized format on its slot view, through the whole dispatch
(OffloadExecutor → ExpertWeights → kernels.format_moe → the format → quant_launch →
quant_prefill), on CPU with the GPU path forced and its kernels stubbed: this counts the work,
tests/kernels/test_quant_prefill_interpret.py checks the bits. The view has the rows of every
later layer's slots and the shared regions (offload/slot_pool.py), but a call dequantizes
only the experts it routes to and runs cdiv(E, chunk) rounds of grouped GEMMs, not one
round a chunk of the view's rows (layer 0 of Qwen3-30B-A3B at 67 slots: 5, not 120)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from xinfer import kernels  # noqa: E402
from xinfer.kernels import gguf_launch, moe_launch, quant_prefill  # noqa: E402
from xinfer.offload.executor import OffloadExecutor  # noqa: E402
from xinfer.offload.slot_cache import NUM_COUNTERS  # noqa: E402
from xinfer.offload.slot_pool import build_slot_caches  # noqa: E402
from xinfer.quant.experts import ExpertWeights  # noqa: E402
from xinfer.quant.nvfp4 import Nvfp4  # noqa: E402

CPU = torch.device("cpu")
NUM_LAYERS, NUM_EXPERTS, NUM_SLOTS, TOP_K, HIDDEN, INTER = 6, 16, 4, 2, 128, 128
TOKENS = 512  # 1,024 pairs: the quantized prefill path (quant_launch.PREFILL_MIN_PAIRS)


@pytest.fixture
def counted(monkeypatch):
    """Force the GPU dispatch on CPU tensors; record what the prefill path would launch."""
    work = {"rounds": 0, "dequantized": [], "max_ids": []}
    fused = quant_prefill.fused_moe

    def fused_moe(*args, **kwargs):
        work["max_ids"].append(kwargs.get("max_ids"))
        return fused(*args, **kwargs)

    def dequantize(kw, n, k, out, first=0, ids=None):
        work["dequantized"] += [e for e in ids[first : first + out.shape[0]].tolist() if e >= 0]
        return out

    fused_with = quant_prefill.fused_moe_with

    def fused_moe_with(*args, **kwargs):
        work["max_ids"].append(kwargs.get("max_ids"))
        return fused_with(*args, **kwargs)

    def gguf_dequantize(w, btype, k, out, first=0, ids=None):
        work["max_ids"].append("gguf")  # reached through gguf_launch's prefill route
        return dequantize(None, 0, k, out, first, ids)

    def grouped_outputs(*args, **kwargs):
        work["rounds"] += 1

    monkeypatch.setattr(kernels, "use_triton", lambda t: True)
    monkeypatch.setattr(quant_prefill, "fused_moe", fused_moe)
    monkeypatch.setattr(quant_prefill, "dequantize", dequantize)
    monkeypatch.setattr(quant_prefill, "fused_moe_with", fused_moe_with)
    monkeypatch.setattr(gguf_launch, "dequantize", gguf_dequantize)
    monkeypatch.setattr(moe_launch, "grouped_outputs", grouped_outputs)
    monkeypatch.setattr(moe_launch, "_combine", lambda y, w, out, k: None)
    # chunks of 4 experts (at the real shapes: 28 of Qwen3-30B-A3B's under 256 MiB)
    monkeypatch.setattr(quant_prefill, "CHUNK_BYTES", 4 * 3 * INTER * HIDDEN * 2)
    return work


def _executor(layer: int, fmt=None) -> OffloadExecutor:
    # NVFP4: a format whose prefill-sized expert calls dequantize (FP8 and INT4 stay in
    # registers: `dequant_experts_in_prefill`)
    weights = ExpertWeights(fmt or Nvfp4(), HIDDEN, INTER)
    specs = weights.specs(NUM_EXPERTS)
    hosts = [{key: torch.zeros(s.shape, dtype=s.dtype) for key, s in specs.items()}] * NUM_LAYERS
    counters = torch.zeros(NUM_LAYERS, NUM_COUNTERS, dtype=torch.int64)
    caches, _ = build_slot_caches(hosts, [NUM_SLOTS] * NUM_LAYERS, CPU, counters, TOKENS * TOP_K)
    return OffloadExecutor(caches[layer], hosts[layer], TOP_K, weights=weights)


@pytest.mark.parametrize("layer", [0, 3])
def test_offloaded_quantized_call_does_not_scale_with_the_view(counted, layer):
    x = _executor(layer)
    rows = next(iter(x.cache.slots.values())).shape[0]
    assert rows == (NUM_LAYERS - layer) * NUM_SLOTS + 2 * (NUM_EXPERTS - NUM_SLOTS)
    hidden = torch.zeros(TOKENS, HIDDEN, dtype=torch.bfloat16)
    ids = (torch.arange(TOKENS * TOP_K) % NUM_EXPERTS).view(TOKENS, TOP_K).to(torch.int32)
    weights = torch.full((TOKENS, TOP_K), 1.0 / TOP_K)
    for call in range(2):  # cold slots (4 slots + 12 overflow rows), then some hits
        counted["rounds"], counted["dequantized"] = 0, []
        x(hidden, ids, weights)
        assert counted["max_ids"][-1] == NUM_EXPERTS
        assert counted["rounds"] == NUM_EXPERTS // 4, (call, rows)  # was rows / 4: 12 or 9
        used = sorted(set(counted["dequantized"]))  # each once in w13's, once in w2's rounds
        assert len(used) == NUM_EXPERTS and sorted(counted["dequantized"]) == sorted(used * 2)
        assert all(r < NUM_SLOTS or r >= x.cache.overflow_base for r in used)


def test_offloaded_gguf_call_takes_the_dequantized_route_over_the_used_ids(counted, monkeypatch):
    """A GGUF layer (Q4_K gate/up, Q6_K down, as Q4_K_M files store them) on its slot view:
    a prefill-sized call reaches quant_prefill through gguf_launch's dequantizer with the
    layer's E as `max_ids`, so it too runs cdiv(E, chunk) rounds, not one per chunk of rows."""
    from xinfer.quant.gguf_formats import GGUFFormat

    assert TOKENS * TOP_K < gguf_launch.PREFILL_MIN_PAIRS  # a smaller call, asked for the route
    monkeypatch.setattr(gguf_launch, "PREFILL_MIN_PAIRS", TOKENS * TOP_K)
    weights = ExpertWeights(GGUFFormat("Q4_K"), HIDDEN * 2, INTER * 2, GGUFFormat("Q6_K"))
    specs = weights.specs(NUM_EXPERTS)
    hosts = [{key: torch.zeros(s.shape, dtype=s.dtype) for key, s in specs.items()}] * NUM_LAYERS
    counters = torch.zeros(NUM_LAYERS, NUM_COUNTERS, dtype=torch.int64)
    caches, _ = build_slot_caches(hosts, [NUM_SLOTS] * NUM_LAYERS, CPU, counters, TOKENS * TOP_K)
    x = OffloadExecutor(caches[0], hosts[0], TOP_K, weights=weights)
    hidden = torch.zeros(TOKENS, HIDDEN * 2, dtype=torch.bfloat16)
    ids = (torch.arange(TOKENS * TOP_K) % NUM_EXPERTS).view(TOKENS, TOP_K).to(torch.int32)
    x(hidden, ids, torch.full((TOKENS, TOP_K), 1.0 / TOP_K))
    # chunks of 4 experts of the fixture's bf16 size at these shapes hold 1 of the doubled ones
    assert counted["rounds"] == NUM_EXPERTS
    used = sorted(set(counted["dequantized"]))
    assert len(used) == NUM_EXPERTS and len(counted["dequantized"]) == 2 * NUM_EXPERTS
    assert all(r < NUM_SLOTS or r >= x.cache.overflow_base for r in used)
    assert counted["max_ids"].count("gguf") == 2 * NUM_EXPERTS  # w13 and w2, each expert
    assert counted["max_ids"][0] == NUM_EXPERTS  # quant_prefill.fused_moe_with's bound
