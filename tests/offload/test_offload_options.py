"""Offload options: parsing and validation (flag wins over the environment), slot sizing for
fractions and `auto`, the host-RAM check, profile mode, and the manager's API."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams, UserError
from xinfer.config import OffloadConfig
from xinfer.layers.moe import FusedMoE
from xinfer.llm import offload_from_env
from xinfer.models.layer_stack import LayerStack
from xinfer.offload import host_store
from xinfer.offload.setup import stream_buffers_for, streamed_together
from xinfer.offload.sizing import (
    GIB,
    LayerShape,
    SlotPlan,
    auto_reserve_bytes,
    choose_stream_buffers,
    device_bytes_for,
    plan_slots,
    slots_for_fraction,
)

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_checkpoint(make_hf_model("mixtral"), tmp_path_factory.mktemp("mixtral")))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for suffix in ("", "_RESERVE_GB", "_PROFILE"):
        monkeypatch.delenv("XINFER_MOE_OFFLOAD" + suffix, raising=False)


@pytest.mark.parametrize("value", ["1.5", "-0.1", "0", "abc", "0.2x", "nan"])
def test_bad_fraction_is_a_clear_error(value, monkeypatch):
    with pytest.raises(UserError, match=r"MoE offload.*\(0, 1\]"):
        OffloadConfig.parse(value)
    monkeypatch.setenv("XINFER_MOE_OFFLOAD", value)
    with pytest.raises(UserError, match="MoE offload"):
        offload_from_env()


def test_bad_reserve_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("XINFER_MOE_OFFLOAD", "auto")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_RESERVE_GB", "-1")
    with pytest.raises(UserError, match="reserve must be >= 0"):
        offload_from_env()
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_RESERVE_GB", "lots")
    with pytest.raises(UserError, match="XINFER_MOE_OFFLOAD_RESERVE_GB must be a number"):
        offload_from_env()


def test_good_values_parse(monkeypatch):
    assert not OffloadConfig.parse(None).is_enabled
    assert OffloadConfig.parse(" AUTO ").is_auto
    assert OffloadConfig.parse("1").fraction == 1.0
    monkeypatch.setenv("XINFER_MOE_OFFLOAD", "0.25")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_RESERVE_GB", "4")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_PROFILE", "1")
    cfg = offload_from_env()
    assert (cfg.fraction, cfg.reserve_gb, cfg.is_profile) == (0.25, 4.0, True)
    assert offload_from_env(moe_offload="auto", reserve_gb=1.0).is_auto  # flag wins


def test_llm_rejects_bad_env_and_flag_wins(ckpt, monkeypatch):
    monkeypatch.setenv("XINFER_MOE_OFFLOAD", "1.5")
    with pytest.raises(UserError, match=r"\(0, 1\]"):
        LLM(ckpt, device="cpu")
    llm = LLM(ckpt, device="cpu", moe_offload=0.5)  # the flag wins over the bad variable
    assert llm.offload_stats()["slots_per_layer"] == [4, 4, 4]


def test_slots_for_fraction():
    assert slots_for_fraction(0.1, 8, 2) == 2  # at least top-k
    assert slots_for_fraction(0.3, 10, 1) == 3  # 0.3 * 10 is 3.0000000000000004
    assert slots_for_fraction(0.2, 128, 8) == 26  # rounded up
    assert slots_for_fraction(1.0, 128, 8) == 128


def test_plan_slots_auto_and_budget():
    layers = [LayerShape(128, 8, 10_000_000)] * 48  # 0.48 GB per slot across the layers
    auto = OffloadConfig(is_auto=True, reserve_gb=2.5)
    regions = 2 * (128 - 40) * 10_000_000  # overflow + 2nd streaming buffer: 2 (E - S) rows
    assert device_bytes_for(layers, 40) == 40 * 480_000_000 + regions
    budget = int(2.5 * GIB) + regions + 40 * 480_000_000 + 1000
    assert plan_slots(layers, auto, budget) == SlotPlan(40, 2)  # 1 buffer: 41, not 1.2x
    assert plan_slots(layers, auto, budget - 2000).slots == 39
    assert plan_slots(layers, auto, None).slots == 128  # unbounded (CPU, no limit)
    assert plan_slots(layers, auto, 10**13).slots == 128  # everything fits
    assert device_bytes_for(layers, 128) == 128 * 480_000_000  # no regions at E slots
    # packed experts: the prompt pass's buffer of 16 experts comes out of the same budget
    packed = OffloadConfig(is_auto=True, reserve_gb=2.5, compress=True)
    assert device_bytes_for(layers, 40, compress=True) == 40 * 480_000_000 + regions + 16e7
    assert plan_slots(layers, packed, budget + 160_000_000).slots == 40
    assert plan_slots(layers, packed, budget).slots == 39
    assert device_bytes_for(layers, 128, compress=True) == 128 * 480_000_000  # nothing streams
    with pytest.raises(UserError, match="cannot fit 8 experts per layer"):
        plan_slots(layers, auto, int(3 * GIB))
    with pytest.raises(UserError, match="lower XINFER_MOE_OFFLOAD"):
        plan_slots(layers, OffloadConfig(fraction=0.5), int(10 * GIB))


QWEN15 = [LayerShape(60, 4, 3 * 2048 * 1408 * 2)] * 24  # Qwen1.5-MoE-A2.7B bf16: 17.3 MB
QWEN3 = [LayerShape(128, 8, 3 * 2048 * 768 * 2)] * 48  # Qwen3-30B-A3B bf16: 9.4 MB


def test_device_bytes_for_one_and_two_stream_buffers():
    expert = QWEN15[0].expert_bytes
    slots = 7 * 24 * expert
    assert device_bytes_for(QWEN15, 7, stream_buffers=1) == slots + 53 * expert
    assert device_bytes_for(QWEN15, 7, stream_buffers=2) == slots + 2 * 53 * expert
    assert device_bytes_for(QWEN15, 7) == slots + 2 * 53 * expert  # two by default
    packed = 16 * expert  # the packed experts' staging buffer, whatever the count
    assert device_bytes_for(QWEN15, 7, True, 1) == slots + 53 * expert + packed
    for buffers in (1, 2):  # every expert on the device: no regions, nothing streams
        assert device_bytes_for(QWEN15, 60, True, buffers) == 60 * 24 * expert


def test_auto_takes_one_stream_buffer_under_a_tight_budget(caplog):
    """Qwen1.5's shape where two buffers leave 7 slots: one gives 9 (>= 1.2 x 7), so `auto`
    takes one and says so; forced counts are honoured."""
    expert = QWEN15[0].expert_bytes
    auto = OffloadConfig(is_auto=True, reserve_gb=0.0)
    budget = device_bytes_for(QWEN15, 7) + expert  # 7 with two; with one 23 S <= 215: 9
    with caplog.at_level("INFO", logger="xinfer"):
        assert plan_slots(QWEN15, auto, budget) == SlotPlan(9, 1)
    assert "one prompt-pass stream buffer (9 slots a layer instead of 7" in caplog.text
    assert plan_slots(QWEN15, replace(auto, stream_buffers=2), budget) == SlotPlan(7, 2)
    assert plan_slots(QWEN15, replace(auto, stream_buffers=1), budget) == SlotPlan(9, 1)
    # the same shape with room: both counts give every expert, no regions at all
    roomy = 60 * 24 * expert
    assert plan_slots(QWEN15, auto, roomy) == SlotPlan(60, 2)
    assert plan_slots(QWEN15, replace(auto, stream_buffers=1), roomy).slots == 60


def test_auto_keeps_two_stream_buffers_where_one_buys_little(caplog):
    """Qwen3-30B-A3B's shape at 38 slots with two buffers: one gives 39 (< 1.2 x 38): two."""
    auto = OffloadConfig(is_auto=True, reserve_gb=0.0)
    budget = device_bytes_for(QWEN3, 38) + 1000
    with caplog.at_level("INFO", logger="xinfer"):
        assert plan_slots(QWEN3, auto, budget) == SlotPlan(38, 2)
    assert "two prompt-pass stream buffers (38 slots a layer; one would give 39" in caplog.text
    assert plan_slots(QWEN3, replace(auto, stream_buffers=1), budget) == SlotPlan(39, 1)


def test_choose_stream_buffers_rule():
    """One buffer where it gives at least 1.2 x the slots of two (the second would cost a
    sixth of the slots or more), or where only one fits; else two."""
    assert choose_stream_buffers(9, 7) == 1
    assert choose_stream_buffers(6, 5) == 1  # exactly 1.2 x
    assert choose_stream_buffers(12, 10) == 1
    assert choose_stream_buffers(11, 10) == 2
    assert choose_stream_buffers(40, 38) == 2
    assert choose_stream_buffers(60, 60) == 2  # every expert fits either way
    assert choose_stream_buffers(4, None) == 1  # only one buffer fits top-k
    assert choose_stream_buffers(None, None) == 2  # neither: the refusal names the budget


def test_auto_refusals_with_stream_buffers():
    """`auto` where not even top-k fit with the forced two but do with one: the refusal
    says so; where neither fits, the usual refusal."""
    expert = QWEN15[0].expert_bytes
    auto = OffloadConfig(is_auto=True, reserve_gb=0.0)
    budget = device_bytes_for(QWEN15, 4, stream_buffers=1)  # top-4 with one buffer only
    assert budget < device_bytes_for(QWEN15, 4)
    assert plan_slots(QWEN15, auto, budget) == SlotPlan(4, 1)
    with pytest.raises(UserError, match=r"cannot fit 4 experts.*one stream buffer \(--moe-off"):
        plan_slots(QWEN15, replace(auto, stream_buffers=2), budget)
    with pytest.raises(UserError, match=r"cannot fit 4 experts per layer .*smaller model$"):
        plan_slots(QWEN15, auto, budget - expert)


def test_fixed_fraction_falls_back_to_one_stream_buffer(caplog):
    """A fraction keeps two buffers where they fit, else one (said at start-up), else the
    refusal; a forced count is honoured, and a forced two that only fits with one is refused
    naming the option."""
    fraction = OffloadConfig(fraction=0.2)  # 12 of 60 slots
    one = device_bytes_for(QWEN15, 12, stream_buffers=1)
    two = device_bytes_for(QWEN15, 12, stream_buffers=2)
    assert plan_slots(QWEN15, fraction, two) == SlotPlan(12, 2)
    assert plan_slots(QWEN15, fraction, None) == SlotPlan(12, 2)  # unbounded
    with caplog.at_level("INFO", logger="xinfer"):
        assert plan_slots(QWEN15, fraction, two - 1) == SlotPlan(12, 1)
    assert "one prompt-pass stream buffer: 12 slots a layer fit" in caplog.text
    assert plan_slots(QWEN15, fraction, one) == SlotPlan(12, 1)
    with pytest.raises(UserError, match=r"0.2 needs .* lower XINFER_MOE_OFFLOAD or use"):
        plan_slots(QWEN15, fraction, one - 1)
    assert plan_slots(QWEN15, replace(fraction, stream_buffers=1), two) == SlotPlan(12, 1)
    assert plan_slots(QWEN15, replace(fraction, stream_buffers=2), two) == SlotPlan(12, 2)
    with pytest.raises(UserError, match=r"lower XINFER_MOE_OFFLOAD \(or --moe-offload-stream"):
        plan_slots(QWEN15, replace(fraction, stream_buffers=2), two - 1)
    with pytest.raises(UserError, match="lower XINFER_MOE_OFFLOAD or use"):
        plan_slots(QWEN15, replace(fraction, stream_buffers=1), one - 1)


class _Decoder(torch.nn.Module):
    """A decoder layer stand-in holding MoE layers of the given intermediate sizes."""

    def __init__(self, *inters: int) -> None:
        super().__init__()
        self.moes = torch.nn.ModuleList(FusedMoE(8, 2, 16, i, True, "cpu") for i in inters)


class _Stacked(torch.nn.Module):
    def __init__(self, *layers: torch.nn.Module) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def layer_stack(self) -> LayerStack:
        return LayerStack(None, list(self.layers), None)


def test_decoder_layer_with_two_moe_layers_of_one_shape_takes_two_stream_buffers(caplog):
    """A prompt pass streams a decoder layer's MoE layers of one shape together, one buffer
    each: such a model gets two buffers (said), a forced one is refused at start-up with the
    option named, three of one shape are refused; MoE layers of different shapes, or a model
    without a layer stack (no prompt pass), leave the choice alone."""
    auto, one = OffloadConfig(fraction=0.2), OffloadConfig(fraction=0.2, stream_buffers=1)
    plain = _Stacked(_Decoder(32), _Decoder(32, 48), _Decoder(48))
    assert streamed_together(plain) == 1
    assert stream_buffers_for(plain, one) is one and stream_buffers_for(plain, auto) is auto
    assert streamed_together(_Decoder(32, 32)) == 1  # no layer stack: no prompt pass
    twice = _Stacked(_Decoder(32), _Decoder(32, 32))
    assert streamed_together(twice) == 2
    with caplog.at_level("INFO", logger="xinfer"):
        assert stream_buffers_for(twice, auto).stream_buffers == 2
    assert "a decoder layer of this model holds two MoE layers of one shape" in caplog.text
    with pytest.raises(UserError, match=r"holds 2 MoE layers .* --moe-offload-stream-buffers 2"):
        stream_buffers_for(twice, one)
    with pytest.raises(UserError, match="holds 3 MoE layers .* without offload"):
        stream_buffers_for(_Stacked(_Decoder(32, 32, 32)), auto)


def test_auto_on_cpu_with_memory_limit(ckpt):
    full = LLM(ckpt, device="cpu", moe_offload="auto")
    assert full.offload_stats()["slots_per_layer"] == [8, 8, 8]
    with pytest.raises(UserError, match="cannot fit 2 experts per layer"):
        LLM(ckpt, device="cpu", moe_offload="auto", gpu_memory_limit_gb=0.001)
    # Experts of 3 x 64 x 32 x 4 bytes; S slots in 3 layers plus 2 (8 - S) overflow and
    # streaming rows: a budget of 20 expert rows fits S = 4 (4 * 3 + 2 * 4 = 20); with one
    # stream buffer of 8 - S rows S = 6 (6 * 3 + 2 = 20), 1.5x: `auto` takes one buffer.
    row = 3 * 64 * 32 * 4
    limit = (_dense_bytes(full) + 20 * row + 100) / GIB
    kw = dict(device="cpu", moe_offload="auto", moe_offload_reserve_gb=0.0)
    small = LLM(ckpt, **kw, gpu_memory_limit_gb=limit)
    st = small.offload_stats()
    assert (st["slots_per_layer"], st["stream_buffers"]) == ([6, 6, 6], 1)
    assert st["staging_gb"] == 2 * row / 1e9  # one region of 8 - 6 rows
    two = LLM(ckpt, **kw, gpu_memory_limit_gb=limit, moe_offload_stream_buffers=2)
    st = two.offload_stats()
    assert (st["slots_per_layer"], st["stream_buffers"]) == ([4, 4, 4], 2)
    assert st["staging_gb"] == 2 * 4 * row / 1e9
    assert full.offload_stats()["stream_buffers"] == 0  # every expert resident: none


def _dense_bytes(llm) -> int:
    """What the model holds on the device besides the experts (parameters and buffers)."""
    model = llm.engine.model
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def test_host_ram_check(ckpt, monkeypatch):
    monkeypatch.setattr(host_store, "available_host_bytes", lambda: 512 << 20)
    with pytest.raises(UserError, match="GB of host RAM but only 0.5 GB is available"):
        LLM(ckpt, device="cpu", moe_offload=0.5)
    monkeypatch.setattr(host_store, "available_host_bytes", lambda: None)  # no /proc
    LLM(ckpt, device="cpu", moe_offload=0.5)


def test_manager_api_and_profile(ckpt):
    llm = LLM(ckpt, device="cpu", moe_offload=0.25, moe_offload_profile=True)
    manager = llm.engine.offload_manager
    llm.generate(prompts(2), GREEDY)
    st = llm.offload_stats()
    assert st["profile"]["calls"] > 0 and st["profile"]["copy_s"] >= 0
    assert not manager.is_graph_safe(1)  # profile mode disables graphs
    assert "hit rate" in manager.format_summary(2.0) and "GB/s" in manager.format_summary(2.0)
    pf = st["prefetch"]  # on by default: the line says what it copied
    want = (
        f"prefetch 2 layers ahead copied {pf['prefetched_bytes'] / 1e9:.2f} GB ({pf['prefetched']}"
    )
    assert want in manager.format_summary()
    plain = LLM(ckpt, device="cpu", moe_offload=0.25).engine.offload_manager
    # 2 slots, top-2: wider batches use overflow rows, so every size up to the budget fits
    assert plain.is_graph_safe(1) and plain.is_graph_safe(64)
    assert not plain.is_graph_safe(plain.max_call_tokens + 1)
    assert "profile" not in plain.stats()


def test_stats_keys(ckpt):
    llm = LLM(ckpt, device="cpu", moe_offload=0.5)
    assert llm.offload_stats()["hits"] == 0
    llm.generate(prompts(1), GREEDY)
    st = llm.offload_stats()
    keys = "hits misses hit_rate bytes_copied staging_copies staging_bytes bytes_moved calls"
    keys += " overflow_misses max_call_misses"
    keys += " slots_per_layer num_experts num_layers pinned_gb slot_gb staging_gb device layers"
    assert set(keys.split()) <= set(st)
    assert st["misses"] > 0 and 0.0 <= st["hit_rate"] <= 1.0
    assert st["bytes_copied"] == st["misses"] * 3 * 64 * 32 * 4
    assert sum(layer["hits"] for layer in st["layers"]) == st["hits"]
    assert st["pinned_gb"] == 0.0  # nothing is pinned on CPU
    llm.engine.offload_manager.reset_stats()
    assert llm.offload_stats()["misses"] == 0


def test_offload_unset_means_no_manager(ckpt):
    assert LLM(ckpt, device="cpu").offload_stats() is None


def test_expert_tensors_handed_over(ckpt):
    llm = LLM(ckpt, device="cpu", moe_offload=0.5)
    for layer in llm.engine.model.moe_layers():
        assert layer.expert_tensors == {}
        assert type(layer.executor).__name__ == "OffloadExecutor"
    assert torch.is_tensor(layer.executor.cache.slots["w13"])


def test_fill_option_is_checked():
    assert OffloadConfig.parse("0.2").fill == "kernel"
    assert OffloadConfig.parse("0.2", fill="copy-engine").fill == "copy-engine"
    with pytest.raises(UserError, match="fill must be one of kernel, copy-engine, got 'dma'"):
        OffloadConfig.parse("0.2", fill="dma")
    with pytest.raises(UserError, match="needs MoE expert offload"):
        OffloadConfig.parse(None, fill="copy-engine")


def test_prefetch_fill_option_is_checked(ckpt):
    """`--moe-prefetch-fill`: one of the fills, only with prefetch, and refused on CPU (no
    copy engine) before any weight is read, like the offload fill."""
    cfg = OffloadConfig.parse("0.2", prefetch_distance=1, prefetch_fill="copy-engine")
    assert (cfg.fill, cfg.prefetch_fill) == ("kernel", "copy-engine")
    assert OffloadConfig.parse("0.2", prefetch_distance=1).prefetch_fill is None
    with pytest.raises(UserError, match="prefetch fill must be one of kernel, copy-engine"):
        OffloadConfig.parse("0.2", prefetch_distance=1, prefetch_fill="dma")
    # prefetch is on by default with offload: its fill may be set without a distance
    assert OffloadConfig.parse("0.2", prefetch_fill="copy-engine").prefetch_layers == 2
    with pytest.raises(UserError, match=r"it needs prefetch \(--moe-prefetch other than 0\)"):
        OffloadConfig.parse("0.2", prefetch_distance=0, prefetch_fill="copy-engine")
    with pytest.raises(UserError, match="needs prefetch .* and MoE expert offload"):
        OffloadConfig.parse(None, prefetch_fill="copy-engine")
    with pytest.raises(UserError, match="--moe-prefetch-fill copy-engine cannot run here"):
        LLM(ckpt, device="cpu", moe_offload=0.5, moe_prefetch=1,
            moe_prefetch_fill="copy-engine")  # fmt: skip


def test_prefetch_margin_needs_prefetch(ckpt):
    """--moe-prefetch-margin is refused where nothing prefetches (no offload, or prefetch
    0), never accepted and ignored; with the default prefetch it is the predictor's."""
    with pytest.raises(UserError, match="tune prefetching: they need prefetch .* and MoE"):
        LLM(ckpt, device="cpu", moe_prefetch_margin=0.0)
    with pytest.raises(UserError, match="tune prefetching: they need prefetch"):
        LLM(ckpt, device="cpu", moe_offload=0.5, moe_prefetch=0, moe_prefetch_margin=0.0)
    llm = LLM(ckpt, device="cpu", moe_offload=0.5, moe_prefetch_margin=0.25)
    assert llm.engine.offload_manager.prefetcher.predictor.margin == 0.25
    assert LLM(ckpt, device="cpu", moe_offload=0.5).engine.config.offload.prefetch_cut == 0.5


def test_packed_experts_prefetch_by_default_with_more_fill_programs(ckpt, monkeypatch):
    """With --moe-offload-compress prefetch is on by default as without it, and where the
    experts are packed its fill kernel gets PACKED_PREFETCH_FILL_PROGRAMS (the packed fill
    keeps less in flight a program) unless --moe-prefetch-programs says otherwise; plain
    experts keep 16, also where the option packs nothing."""
    import xinfer.offload.prefetch_setup as setup
    from xinfer.offload.prefetch import (
        PACKED_PREFETCH_FILL_PROGRAMS,
        PREFETCH_FILL_PROGRAMS,
        Prefetcher,
    )

    assert PACKED_PREFETCH_FILL_PROGRAMS > PREFETCH_FILL_PROGRAMS
    assert OffloadConfig.parse("0.5", compress=True).prefetch_layers == 2
    seen = []

    def spy(*args, **kw):
        seen.append(kw["fill_programs"])
        return Prefetcher(*args, **kw)

    monkeypatch.setattr(setup, "Prefetcher", spy)
    bf16 = dict(device="cpu", dtype="bfloat16", moe_offload=0.5)
    packed = LLM(ckpt, **bf16, moe_offload_compress=True)
    assert packed.offload_stats()["compressed"]
    assert packed.engine.offload_manager.prefetcher.distance == 2
    LLM(ckpt, **bf16)
    LLM(ckpt, **bf16, moe_offload_compress=True, moe_prefetch_programs=24)
    # float32 experts do not pack (the option says so and leaves them): a plain fill
    LLM(ckpt, device="cpu", dtype="float32", moe_offload=0.5, moe_offload_compress=True)
    assert seen == [PACKED_PREFETCH_FILL_PROGRAMS, PREFETCH_FILL_PROGRAMS, 24,
                    PREFETCH_FILL_PROGRAMS]  # fmt: skip


def test_prefetch_tuning_options_are_checked(ckpt):
    """`--moe-prefetch-programs` / `--moe-prefetch-issue`: valid values only, only with
    prefetch, programs only for the kernel prefetch fill; honoured by the prefetcher."""
    cfg = OffloadConfig.parse(
        "0.2", prefetch_distance=1, prefetch_programs=64, prefetch_issue="before-lookup"
    )
    assert (cfg.prefetch_programs, cfg.prefetch_issue) == (64, "before-lookup")
    with pytest.raises(UserError, match="issue point must be one of after-fill, before-lookup"):
        OffloadConfig.parse("0.2", prefetch_distance=1, prefetch_issue="early")
    with pytest.raises(UserError, match="prefetch programs must be >= 1"):
        OffloadConfig.parse("0.2", prefetch_distance=1, prefetch_programs=0)
    assert OffloadConfig.parse("0.2", prefetch_programs=64).prefetch_programs == 64  # default on
    with pytest.raises(UserError, match=r"they need prefetch \(--moe-prefetch other than 0\)"):
        OffloadConfig.parse("0.2", prefetch_distance=0, prefetch_programs=64)
    with pytest.raises(UserError, match="they need prefetch"):
        OffloadConfig.parse("0.2", prefetch_distance=0, prefetch_issue="before-lookup")
    with pytest.raises(UserError, match="and MoE expert offload"):
        OffloadConfig.parse(None, prefetch_programs=64)
    with pytest.raises(UserError, match="copy-engine prefetch fill has no programs"):
        OffloadConfig.parse(
            "0.2", prefetch_distance=1, prefetch_fill="copy-engine", prefetch_programs=8
        )
    with pytest.raises(UserError, match="--moe-prefetch-programs must be >= 1"):
        LLM(ckpt, device="cpu", moe_offload=0.5, moe_prefetch=1, moe_prefetch_programs=0)
    llm = LLM(ckpt, device="cpu", moe_offload=0.5, moe_prefetch=1,
              moe_prefetch_issue="before-lookup")  # fmt: skip
    prefetcher = next(x.prefetch[0] for x in llm.engine.offload_manager.executors
                      if getattr(x, "prefetch", None))  # fmt: skip
    assert prefetcher.issue_after_fill is False


def test_copy_engine_fill_is_refused_without_a_gpu(ckpt):
    """On CPU there is no copy engine: one sentence that names the way out, not a fallback
    that silently does something else."""
    with pytest.raises(UserError, match="copy-engine cannot run here: it needs an NVIDIA GPU"):
        LLM(ckpt, device="cpu", moe_offload=0.5, moe_offload_fill="copy-engine")


def test_copy_engine_fill_is_refused_before_any_weight_is_read(ckpt, monkeypatch):
    import xinfer.engine.engine as engine_module

    def not_yet(*args, **kwargs):
        raise AssertionError("weights were read before the option was checked")

    monkeypatch.setattr(engine_module, "build_model", not_yet)
    with pytest.raises(UserError, match="copy-engine cannot run here"):
        LLM(ckpt, device="cpu", moe_offload=0.5, moe_offload_fill="copy-engine")


def test_offload_options_on_a_dense_model_are_ignored_with_a_note(tmp_path, caplog):
    """A model without routed experts runs with `--moe-offload`, prefetch and the fill
    option given (one log line), rather than failing on the options it ignores."""
    import dense_models as dm

    dm.make_dense("llama").save_pretrained(tmp_path)
    with caplog.at_level("INFO", logger="xinfer"):
        llm = LLM(str(tmp_path), device="cpu", moe_offload=0.5, moe_prefetch=1,
                  moe_offload_fill="copy-engine")  # fmt: skip
    assert "MoE offload is ignored" in caplog.text
    assert llm.generate([[3, 4, 5]], GREEDY)[0].token_ids


def test_auto_keeps_what_one_full_sequence_needs():
    """`auto` leaves XINFER_MOE_OFFLOAD_RESERVE_GB free, or more where one --max-model-len
    sequence's KV cache and the workspace need more (a model with a wide KV, e.g. Qwen1.5-MoE's
    full multi-head attention at 8k, needs ~3 GB): the slots shrink instead of start-up failing
    on a KV cache shorter than one sequence."""
    layers = [LayerShape(128, 8, 10_000_000)] * 48
    auto = OffloadConfig(is_auto=True, reserve_gb=2.5)
    regions = 2 * (128 - 40) * 10_000_000
    budget = int(2.5 * GIB) + regions + 40 * 480_000_000 + 1000
    assert auto_reserve_bytes(auto, int(GIB)) == int(2.5 * GIB)  # the reserve is enough
    assert plan_slots(layers, auto, budget, int(GIB)).slots == 40
    more = int(2.5 * GIB) + 3 * 480_000_000  # three slots' worth more than the reserve
    assert auto_reserve_bytes(auto, more) == more
    assert plan_slots(layers, auto, budget, more).slots == 36  # regions: 2 rows per slot less
    with pytest.raises(UserError, match="one --max-model-len sequence's KV cache"):
        plan_slots(layers, auto, budget, budget)


def test_min_free_gpu_bytes_is_what_the_kv_sizing_needs(monkeypatch):
    """The floor `auto` keeps is exactly what `plan_num_blocks` needs for one
    --max-model-len sequence (plus a hybrid model's state): at the floor the cache holds one
    sequence, one block's worth below it it does not."""
    from types import SimpleNamespace

    from xinfer.config import CacheConfig, EngineConfig
    from xinfer.engine import memory

    # Qwen1.5-MoE-A2.7B's KV: 24 layers, K and V of 16 heads x 128, bf16
    cfg = SimpleNamespace(kv_bytes_per_token=lambda dtype: 24 * 2 * 16 * 128 * 2)
    for util, state in [(0.9, 0), (0.75, 12_345_678)]:
        engine = EngineConfig(model="x", cache=CacheConfig(gpu_memory_utilization=util))
        kv_dtype, max_len = torch.bfloat16, 8448
        floor = memory.min_free_gpu_bytes(cfg, engine, kv_dtype, max_len, state)
        blocks_per_seq = -(-max_len // engine.cache.block_size)
        per_block = cfg.kv_bytes_per_token(kv_dtype) * engine.cache.block_size
        cuda = torch.device("cuda")
        for free, enough in [(floor, True), (floor - per_block, False)]:
            monkeypatch.setattr(memory, "usable_gpu_bytes", lambda d, lim, free=free: free)
            blocks = memory.plan_num_blocks(cfg, engine, cuda, kv_dtype, max_len, state)
            assert (blocks >= blocks_per_seq) is enough, (util, state, free)


def test_offload_policy_option():
    """`--moe-offload-policy`: lfu (default) or lru; given without offload it is refused; it
    combines with prefetch (the reservation follows the policy); a bad name is refused."""
    from xinfer.args import EngineArgs

    assert OffloadConfig(fraction=0.2).policy == "lfu"
    assert EngineArgs(moe_offload=0.2).offload_config().policy == "lfu"
    assert EngineArgs(moe_offload=0.2, moe_offload_policy="lru").offload_config().policy == "lru"
    with pytest.raises(UserError, match="policy must be one of lru, lfu"):
        OffloadConfig(fraction=0.2, policy="fifo")
    for policy in ("lfu", "lru"):
        with pytest.raises(UserError, match=f"--moe-offload-policy {policy} applies to MoE"):
            EngineArgs(moe_offload_policy=policy).offload_config()
    both = OffloadConfig(fraction=0.2, policy="lfu", prefetch_distance=1)
    assert (both.policy, both.prefetch_distance) == ("lfu", 1)


def test_offload_policy_from_the_environment(monkeypatch):
    """XINFER_MOE_OFFLOAD_POLICY sets it where the option is not given; the option wins."""
    from xinfer.args import EngineArgs

    monkeypatch.setenv("XINFER_MOE_OFFLOAD_POLICY", "LRU")
    assert EngineArgs(moe_offload=0.2).offload_config().policy == "lru"
    assert EngineArgs(moe_offload=0.2, moe_offload_policy="lfu").offload_config().policy == "lfu"
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_POLICY", "fifo")
    with pytest.raises(UserError, match="policy must be one of lru, lfu"):
        EngineArgs(moe_offload=0.2).offload_config()
    monkeypatch.delenv("XINFER_MOE_OFFLOAD_POLICY")
    assert EngineArgs(moe_offload=0.2).offload_config().policy == "lfu"


def test_offload_settings_from_the_environment_without_offload(monkeypatch, caplog):
    """An offload setting exported for every run (XINFER_MOE_OFFLOAD_POLICY / _COMPRESS /
    _PROFILE) does not break a run without offload: dropped, with a warning naming it. The
    same given as an option is refused."""
    from xinfer.args import EngineArgs

    monkeypatch.setenv("XINFER_MOE_OFFLOAD_POLICY", "lru")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_COMPRESS", "1")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_PROFILE", "1")
    with caplog.at_level("WARNING", logger="xinfer"):
        cfg = EngineArgs().offload_config()
    assert not cfg.is_enabled and not cfg.compress and not cfg.is_profile
    for name in ("POLICY=lru", "COMPRESS=True", "PROFILE=True"):
        assert f"XINFER_MOE_OFFLOAD_{name} has no effect" in caplog.text, caplog.text
    with_offload = EngineArgs(moe_offload=0.2).offload_config()
    assert (with_offload.policy, with_offload.compress, with_offload.is_profile) == (
        "lru",
        True,
        True,
    )
    for kw, needle in (
        ({"moe_offload_policy": "lfu"}, "--moe-offload-policy lfu applies"),
        ({"moe_offload_compress": True}, "--moe-offload-compress applies"),
        ({"moe_offload_profile": True}, "--moe-offload-profile applies"),
    ):
        with pytest.raises(UserError, match=needle):
            EngineArgs(**kw).offload_config()


def test_compress_option():
    """`--moe-offload-compress` needs offload and the fill kernel (the copy engine cannot
    unpack)."""
    assert OffloadConfig(fraction=0.2, compress=True).compress
    with pytest.raises(UserError, match="copy engine only copies bytes"):
        OffloadConfig(fraction=0.2, compress=True, fill="copy-engine")
    with pytest.raises(UserError, match="copy engine only copies bytes"):
        OffloadConfig(fraction=0.2, compress=True, prefetch_distance=1, prefetch_fill="copy-engine")


def test_stream_buffers_option():
    """`--moe-offload-stream-buffers`: auto (None), 1 or 2, as a string (the command line)
    or a number (LLM's keyword); anything else, or 1 or 2 without offload, is one sentence."""
    from xinfer import __version__
    from xinfer.args import EngineArgs, build_parser

    assert OffloadConfig(fraction=0.2).stream_buffers is None
    assert EngineArgs(moe_offload=0.2).offload_config().stream_buffers is None
    for value, want in (("auto", None), ("1", 1), (2, 2), (" 2 ", 2)):
        args = EngineArgs(moe_offload="auto", moe_offload_stream_buffers=value)
        assert args.offload_config().stream_buffers == want, value
    argv = ["--moe-offload", "0.3", "--moe-offload-stream-buffers", "1"]
    args = EngineArgs.from_namespace(build_parser(__version__).parse_args(argv))
    assert args.create_engine_config().offload.stream_buffers == 1
    for bad in ("3", "0", "two", 3, ""):
        with pytest.raises(UserError, match="^--moe-offload-stream-buffers must be auto, 1 or 2"):
            EngineArgs(moe_offload=0.2, moe_offload_stream_buffers=bad)
    for bad in (True, 1.0):
        with pytest.raises(UserError, match="must be a string or an integer, got"):
            EngineArgs(moe_offload=0.2, moe_offload_stream_buffers=bad)
    with pytest.raises(UserError, match="stream buffers must be 1 or 2 .None: auto., got 3"):
        OffloadConfig(fraction=0.2, stream_buffers=3)
    assert not EngineArgs(moe_offload_stream_buffers="auto").offload_config().is_enabled
    for value in (1, "2"):
        with pytest.raises(UserError, match=r"buffers \d sizes .* it needs MoE expert offload"):
            EngineArgs(moe_offload_stream_buffers=value).offload_config()
    with pytest.raises(UserError, match="it needs MoE expert offload"):
        OffloadConfig(stream_buffers=1)


def test_stream_buffers_where_nothing_streams_is_said(ckpt, caplog):
    """Every expert on the device: no stream buffers (stats 0), and a count given says it has
    no effect rather than being dropped silently."""
    with caplog.at_level("INFO", logger="xinfer"):
        llm = LLM(ckpt, device="cpu", moe_offload=1.0, moe_offload_stream_buffers=1)
    assert llm.offload_stats()["stream_buffers"] == 0
    assert "--moe-offload-stream-buffers 1 has no effect: every layer keeps" in caplog.text


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])  # all MoE; a dense layer between
def test_one_stream_buffer_greedy_equals_no_offload(arch, ckpt, tmp_path):
    """--moe-offload-stream-buffers 1: a prompt longer than the step budget takes the prompt
    pass (each offloaded layer streamed once, every one into the same region) and the greedy
    tokens are those of the engine without offload, and of two buffers."""
    path = ckpt if arch == "mixtral" else str(write_checkpoint(make_hf_model(arch), tmp_path))
    long_prompt = (prompts(4, seed=5)[3] * 2)[:45]
    batch = [long_prompt, *prompts(2)]
    kw = dict(device="cpu", max_num_batched_tokens=16)
    want = [r.token_ids for r in LLM(path, **kw).generate(batch, GREEDY)]
    for buffers in ("1", 2):
        llm = LLM(path, **kw, moe_offload=0.25, moe_offload_stream_buffers=buffers)
        got = [r.token_ids for r in llm.generate(batch, GREEDY)]
        st = llm.offload_stats()
        assert st["stream_buffers"] == int(buffers)
        assert st["staging_copies"] >= st["offloaded_layers"] > 0  # a prompt pass ran
        assert got == want, (arch, buffers)
