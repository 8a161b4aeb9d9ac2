"""What the operator sees: the start-up summary (device, dtype, weights, load time, KV
tokens, offload, prefix caching), the periodic stats line while busy (none when idle or
switched off), and per-request timings on the finishing output (queue, prefill, decode,
preemptions) that the server's metrics histogram."""

from __future__ import annotations

import logging
import re

import pytest
from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams
from xinfer.engine.stats import StatsLogger

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(write_checkpoint(make_hf_model("qwen3_moe"), tmp_path_factory.mktemp("obs")))


def test_startup_summary(model_path, caplog):
    with caplog.at_level(logging.INFO, logger="xinfer"):
        LLM(model_path, device="cpu", dtype="float32", moe_offload=0.5, num_kv_blocks=40)
    [line] = [r.getMessage() for r in caplog.records if "ready in" in r.getMessage()]
    for needle in ("Qwen3MoeForCausalLM on cpu", "float32", "GiB of experts in host RAM",
                   "4 of 8 experts per layer", "prefetch 2 layers ahead)",
                   "KV cache: 640 tokens", "max model len 512", "prefix caching on"):  # fmt: skip
        assert needle in line, (needle, line)
    phases = re.search(r"ready in [\d.]+ s \((.*?)\):", line).group(1)  # where the time went
    assert [p.split()[0] for p in phases.split(", ")] == ["weights", "offload", "runner"], line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="xinfer"):
        LLM(model_path, device="cpu", dtype="float32", moe_offload=0.5, moe_prefetch=0,
            num_kv_blocks=40)  # fmt: skip
    [line] = [r.getMessage() for r in caplog.records if "ready in" in r.getMessage()]
    assert "no prefetch)" in line, line


def test_request_timings_on_the_last_output(model_path):
    llm = LLM(model_path, device="cpu", block_size=4, num_kv_blocks=24, max_model_len=96)
    engine = llm.engine
    for p in prompts(4, seed=9):
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=40))
    finished = []
    while engine.has_unfinished():
        for out in engine.step():
            assert (out.metrics is not None) == out.finished
            if out.finished:
                finished.append(out.metrics)
    assert len(finished) == 4
    for m in finished:
        assert min(m.queue_s, m.prefill_s, m.decode_s) >= 0
        assert m.e2e_s == pytest.approx(m.queue_s + m.prefill_s + m.decode_s)
        assert m.num_output_tokens >= 1
    assert sum(m.num_preemptions for m in finished) == engine.scheduler.num_preemptions > 0
    assert max(m.queue_s for m in finished) > 0  # the later ones waited for a batch slot


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_stats_line_while_busy(model_path, caplog):
    llm = LLM(model_path, device="cpu", moe_offload=0.5, log_stats_interval=5)
    engine = llm.engine
    clock = FakeClock()
    engine.stats_logger = StatsLogger(5.0, clock)
    engine.stats_logger.reset(engine)
    clock.now += 1000  # an idle hour does not count
    with caplog.at_level(logging.INFO, logger="xinfer"):
        engine.add_request(prompts(1, seed=1)[0], GREEDY)
        engine.add_request(prompts(1, seed=1)[0], GREEDY)  # admitted together: no hit yet
        engine.step()  # both prompts: not yet 5 s
        clock.now += 2
        engine.step()
        clock.now += 3
        engine.step()  # 5 s after the first step began: one line
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine:")]
    assert len(lines) == 1, lines
    line = lines[0]
    num_prompt = 2 * len(prompts(1, seed=1)[0])
    assert f"prompt {num_prompt / 5:.1f} tok/s" in line
    assert f"generation {6 / 5:.1f} tok/s" in line  # two tokens a step
    assert "2 running, 0 waiting" in line and "KV cache" in line
    assert "prefix cache 0.0% hits" in line and "expert cache" in line


def test_no_stats_lines_when_off(model_path, caplog):
    llm = LLM(model_path, device="cpu", log_stats_interval=0)
    with caplog.at_level(logging.INFO, logger="xinfer"):
        llm.generate(prompts(2), GREEDY)
    assert not [r for r in caplog.records if r.getMessage().startswith("engine:")]
