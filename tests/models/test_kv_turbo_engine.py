"""`--kvcache-dtype turbo4|turbo3` (TurboQuant, kv/turbo.py) through the engine on CPU: the
layers get turbo caches and generate end to end (MoE with q/k norms, a sliding-window dense
model, a hybrid with recurrent state, chunked prefill and prefix caching on); the logits stay
close to a full-precision cache and greedy picks mostly agree on the bundled (trained) demo
model; a fixed memory budget holds ~3.9x / ~5.1x the tokens; every offload fraction gives
the same bytes; a head_dim that is not a multiple of 8 is refused in one sentence."""

from __future__ import annotations

import pytest
import tiny_models as tm
import torch
from dense_models import make_dense

from xinfer import LLM, SamplingParams, UserError
from xinfer.engine import memory
from xinfer.engine.request import Request
from xinfer.engine.scheduler import ScheduledRequest, SchedulerOutput
from xinfer.engine.stats import startup_summary
from xinfer.kv.turbo import TurboKVCache

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def _all_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """Logits (len(ids), V) of one prompt pass over `ids` (its K/V go through the cache, so
    every score reads the quantized keys)."""
    engine = llm.engine
    req = Request("probe", list(ids), SamplingParams())
    req.block_ids = engine.allocator.allocate(engine.allocator.blocks_for(len(ids)))
    try:
        inp = engine.runner.prepare(SchedulerOutput([ScheduledRequest(req, len(ids))]))
        return engine.model.compute_logits(engine.runner.forward(inp))
    finally:
        engine.allocator.free(req.block_ids)


@pytest.fixture(scope="module")
def demo_runs():
    """kv dtype → LLM on the demo model (float32 activations), and the full-precision run's
    greedy sequences (prompt + 48 tokens) to score every cache on."""
    llms = {
        kv: LLM("demo", device="cpu", dtype="float32", kv_cache_dtype=kv)
        for kv in ("auto", "turbo4", "turbo3")
    }
    base = llms["auto"]
    prompts = ["def read_file(path):", "import os\n", "class Stack:\n    def __init__(self):"]
    params = SamplingParams(temperature=0, max_tokens=48)
    seqs = []
    for text in prompts:
        ids = base.tokenizer.encode(text)
        seqs.append(ids + base.generate([ids], params)[0].token_ids)
    return llms, seqs


# Measured on these sequences (teacher-forced, 163 positions): relative logits error 3.3-4.7%
# (turbo4) and 7.4-9.9% (turbo3) per sequence, greedy picks agreeing at 95% and 94% of the
# positions (fp8 e4m3, for scale: 1.8-2.6%, 99%; bf16 0.1%, 100%).
@pytest.mark.parametrize("kv, max_rel, min_agree", [("turbo4", 0.07, 0.9), ("turbo3", 0.14, 0.85)])
def test_demo_logits_close_and_greedy_mostly_equal(demo_runs, kv, max_rel, min_agree):
    llms, seqs = demo_runs
    assert isinstance(llms[kv].engine.runner.kv_caches[0], TurboKVCache)
    agree = total = 0
    rels = []
    for ids in seqs:
        ref, got = _all_logits(llms["auto"], ids), _all_logits(llms[kv], ids)
        rels.append(((got - ref).norm() / ref.norm()).item())
        agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
        total += len(ids)
    assert 0 < max(rels) < max_rel, rels
    assert agree / total >= min_agree, (agree, total)


def test_turbo4_is_closer_than_turbo3(demo_runs):
    llms, seqs = demo_runs
    err = {}
    for kv in ("turbo4", "turbo3"):
        diffs = [_all_logits(llms[kv], s) - _all_logits(llms["auto"], s) for s in seqs]
        err[kv] = sum(d.norm().item() for d in diffs)
    assert err["turbo4"] < 0.75 * err["turbo3"], err


def test_demo_generates_coherent_text(demo_runs):
    llms, _ = demo_runs
    for kv in ("turbo4", "turbo3"):
        out = llms[kv].generate(
            ["def read_file(path):"], SamplingParams(temperature=0, max_tokens=24)
        )
        assert "file" in out[0].text, (kv, out[0].text)


def _checkpoint(kind: str, tmp_path, **overrides):
    if kind in tm.ARCHS:
        return tm.write_checkpoint(tm.make_hf_model(kind, **overrides), tmp_path / kind)
    return tm.write_checkpoint(make_dense(kind, **overrides), tmp_path / kind)


@pytest.mark.parametrize("kind", ["qwen3_moe", "gemma3_text", "qwen3_next"])
@pytest.mark.parametrize("kv", ["turbo4", "turbo3"])
def test_generates_end_to_end(tmp_path, kind, kv):
    """Chunked prefill (a 6-token budget), a sliding window (gemma3), recurrent state
    (qwen3_next), prefix caching (the second run of the same prompts hits)."""
    llm = LLM(str(_checkpoint(kind, tmp_path)), device="cpu", dtype="float32",
              kv_cache_dtype=kv, max_num_batched_tokens=16)  # fmt: skip
    caches = llm.engine.runner.kv_caches
    assert caches and all(isinstance(c, TurboKVCache) and c.bits == int(kv[-1]) for c in caches)
    prompts = tm.prompts(3, seed=4)
    first = [r.token_ids for r in llm.generate(prompts, GREEDY)]
    stats = llm.engine.prefix_cache_stats  # None: a hybrid (its state is not in blocks)
    before = stats().hits if kind != "qwen3_next" else 0
    again = [r.token_ids for r in llm.generate(prompts, GREEDY)]
    assert all(len(t) == 24 for t in first + again)
    if kind != "qwen3_next":
        assert stats().hits > before  # the 17-token prompt's full block
    assert f"tokens ({kv})" in startup_summary(llm.engine, 1.0, 0, 0)


def test_capacity_in_a_fixed_budget(tmp_path, monkeypatch):
    """The same KV byte budget holds 256 / 66 = 3.9x (turbo4) and 256 / 50 = 5.1x (turbo3)
    the tokens of a bf16 cache at head_dim 128 (the CPU engine sizes from a byte cap, which
    the allocated caches then fill to within a block)."""
    path = _checkpoint("qwen3_moe", tmp_path, head_dim=128)
    cap = 1 << 20
    monkeypatch.setattr(memory, "_CPU_MAX_KV_BYTES", cap)
    tokens = {}
    for kv in ("bf16", "turbo4", "turbo3"):
        llm = LLM(str(path), device="cpu", dtype="bfloat16", kv_cache_dtype=kv,
                  max_model_len=256, max_num_seqs=64)  # fmt: skip
        tokens[kv] = llm.engine.kv_tokens
        allocated = sum(t.numel() * t.element_size() for c in llm.engine.runner.kv_caches
                        for t in (c.tensors() if isinstance(c, TurboKVCache) else c))  # fmt: skip
        per_block = (
            llm.engine.model_config.kv_bytes_per_token(llm.engine.config.cache.kv_dtype) * 16
        )
        assert allocated == tokens[kv] // 16 * per_block and cap - per_block < allocated <= cap
    assert tokens["turbo4"] / tokens["bf16"] == pytest.approx(256 / 66, rel=0.05)
    assert tokens["turbo3"] / tokens["bf16"] == pytest.approx(256 / 50, rel=0.05)


def test_offload_fractions_give_identical_bytes_with_a_turbo_cache(tmp_path):
    path = tm.write_checkpoint(tm.make_hf_model("qwen3_moe", seed=3, num_experts=16),
                               tmp_path / "m")  # fmt: skip
    prompts = tm.prompts(3, seed=1)
    outs = {}
    for fraction in (None, 0.1, 0.5, 1.0):
        llm = LLM(str(path), device="cpu", kv_cache_dtype="turbo4", moe_offload=fraction,
                  max_num_batched_tokens=16)  # fmt: skip
        outs[fraction] = [r.token_ids for r in llm.generate(prompts, GREEDY)]
    assert all(outs[f] == outs[None] for f in outs), outs


def test_head_dim_not_a_multiple_of_8_is_refused(tmp_path):
    path = _checkpoint("qwen3_moe", tmp_path, head_dim=12)
    with pytest.raises(UserError, match=r"multiple of 8.*head_dim is 12") as err:
        LLM(str(path), device="cpu", kv_cache_dtype="turbo3")
    assert "\n" not in str(err.value)


def test_cli_runs_turbo4_and_refuses_a_bad_head_dim_in_one_line(tmp_path):
    """`xinfer --m demo --kvcache-dtype turbo4` prints a completion and names the cache in
    its start-up line; turbo3 on a head_dim of 12 ends with one `xinfer: error:` line."""
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "xinfer.cli", "--d", "cpu", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    proc = cli("--m", "demo", "--kvcache-dtype", "turbo4", "--prompt", "def read_file(path):",
               "--max-tokens", "12", "--ignore-eos")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and "(turbo4)" in proc.stderr, proc.stderr
    bad = _checkpoint("qwen3_moe", tmp_path, head_dim=12)
    proc = cli("--m", str(bad), "--kvcache-dtype", "turbo3", "--prompt", "x")
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("xinfer: error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1 and "multiple of 8" in errors[0], proc.stderr
