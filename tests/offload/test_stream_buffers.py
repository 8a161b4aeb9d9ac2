"""The prompt pass's stream buffers (`--moe-offload-stream-buffers`, offload/sizing.py): the
bytes of one or two, `auto`'s choice by the slots they buy, a fixed fraction's fallback, the
refusals, a decoder layer streaming two MoE layers of one shape, and greedy output with one
buffer equal to no offload."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams, UserError
from xinfer.config import OffloadConfig
from xinfer.layers.moe import FusedMoE
from xinfer.models.layer_stack import LayerStack
from xinfer.offload.setup import stream_buffers_for, streamed_together
from xinfer.offload.sizing import (
    LayerShape,
    SlotPlan,
    choose_stream_buffers,
    device_bytes_for,
    plan_slots,
)

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


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


def test_stream_buffers_option():
    """`--moe-offload-stream-buffers`: auto (None), 1 or 2, as a string (the command line)
    or a number (LLM's keyword); anything else, or 1 or 2 without offload, is one sentence."""
    from xinfer import __version__
    from xinfer.args import EngineArgs
    from xinfer.cli_args import build_parser

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


def test_auto_gives_up_slots_where_start_up_took_more_than_the_plan(ckpt, caplog, monkeypatch):
    """Where the free memory measured after the slots are built falls below what `auto` keeps
    (seen on an H100 with --isq q8_0: 0.09 GB more than the plan counts), the slots are
    rebuilt from a plan that many bytes smaller, and the output is unchanged. On CPU nothing
    is measured: the measurement is faked here."""
    import xinfer.offload.setup as setup

    kw = dict(device="cpu", moe_offload="auto", gpu_memory_limit_gb=0.0009)
    kw["moe_offload_reserve_gb"] = 0.0
    batch = prompts(3)
    want = [r.token_ids for r in LLM(ckpt, device="cpu").generate(batch, GREEDY)]
    before = LLM(ckpt, **kw).offload_stats()["slots_per_layer"]
    calls = []

    def short_by_two_slots(device, limit_gb, budget, layers, plan, compress, reserve):
        calls.append(plan.slots)
        return 2 * sum(s.expert_bytes for s in layers)

    monkeypatch.setattr(setup, "unplanned_bytes", short_by_two_slots)
    with caplog.at_level("INFO", logger="xinfer"):
        llm = LLM(ckpt, **kw)
    after = llm.offload_stats()["slots_per_layer"]
    assert calls == [before[0]]  # measured once, after the first build
    assert all(a < b for a, b in zip(after, before)), (before, after)
    assert "more than the slot plan counts" in caplog.text
    assert [r.token_ids for r in llm.generate(batch, GREEDY)] == want
