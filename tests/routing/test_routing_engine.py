"""Routing sources through the whole engine (CPU): the routing model keeps greedy output
byte-identical across offload settings (batched, prompts longer than a step: prompt passes);
recording writes exactly the ids the router chose, prompt passes included (replaying the
trace reproduces the router's run); the default installs nothing; bad options fail with one
sentence."""

from __future__ import annotations

import pytest
from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams, UserError, __version__
from xinfer.args import EngineArgs
from xinfer.cli_args import build_parser
from xinfer.routing.trace import read_trace, request_streams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
NUM_EXPERTS = 16
# prompts of 5, 17, 9 and 45 tokens: with 16 tokens a step, the 17 and the 45 run as prompt
# passes
PROMPTS = prompts(3, seed=1) + [list(range(3, 48))]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    model = make_hf_model("qwen3_moe", seed=3, num_experts=NUM_EXPERTS)
    return str(write_checkpoint(model, tmp_path_factory.mktemp("qwen3_moe")))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("XINFER_MOE_OFFLOAD", raising=False)


def _run(ckpt, **kw):
    llm = LLM(ckpt, device="cpu", max_num_batched_tokens=16, **kw)
    out = [r.token_ids for r in llm.generate(PROMPTS, GREEDY)]
    return llm, out


def test_routing_model_output_identical_across_offload(ckpt):
    _, router = _run(ckpt)
    base_llm, base = _run(ckpt, routing_source="qwen3-30b-a3b")
    assert base != router  # the model's routing really was replaced
    assert all(layer.routing is not None for layer in base_llm.engine.model.moe_layers())
    for fraction in (0.1, 0.25, 0.5, 1.0):
        llm, got = _run(ckpt, routing_source="qwen3-30b-a3b", moe_offload=fraction)
        assert got == base, f"routing-model output changed with offload {fraction}"
        if fraction < 1.0:
            assert llm.offload_stats()["misses"] > 0


def test_record_then_replay_reproduces_the_router(ckpt, tmp_path):
    path = tmp_path / "routing.trace"
    llm, recorded = _run(ckpt, record_routing=str(path))
    assert not llm.engine.runner.look_ahead_enabled  # each step recorded after its forward
    llm.close()
    _, plain = _run(ckpt)
    assert recorded == plain  # recording changes nothing
    header, steps = read_trace(path)
    assert (header.num_layers, header.top_k, header.num_experts) == (2, 2, NUM_EXPERTS)
    streams = {rid: ids for rid, first, ids in request_streams(steps) if first == 0}
    lengths = [len(p) + GREEDY.max_tokens - 1 for p in PROMPTS]  # the last token is not fed
    assert [streams[f"req-{i}"].shape for i in range(4)] == [(2, n, 2) for n in lengths]
    assert all(0 <= s.ids.min() and s.ids.max() < NUM_EXPERTS for s in steps)
    # prompts longer than a step's 16 tokens ran as prompt passes (layer by layer over their
    # chunks, across steps): one record each, the whole prompt
    records = [(first, n) for s in steps for rid, first, n in s.requests if rid == "req-3"]
    assert records[0] == (0, 45) and all(n == 1 for _, n in records[1:])
    _, replayed = _run(ckpt, routing_source=f"replay:{path}", moe_offload=0.25)
    assert replayed == plain  # the trace holds exactly the experts the router chose


def test_default_installs_nothing(ckpt):
    llm = LLM(ckpt, device="cpu")
    assert llm.engine.routing is None
    assert all(layer.routing is None for layer in llm.engine.model.moe_layers())


def test_bad_options_are_one_sentence(ckpt, tmp_path):
    with pytest.raises(UserError, match="unknown routing source"):
        LLM(ckpt, device="cpu", routing_source="qwen9")
    with pytest.raises(UserError, match="does not exist"):
        LLM(ckpt, device="cpu", routing_source=f"replay:{tmp_path / 'missing'}")
    (tmp_path / "junk").write_bytes(b"not a trace")
    with pytest.raises(UserError, match="is not a routing trace"):
        LLM(ckpt, device="cpu", routing_source=f"replay:{tmp_path / 'junk'}")


def test_replay_of_another_shape_is_refused(ckpt, tmp_path):
    other = make_hf_model("qwen3_moe", seed=3, num_experts=NUM_EXPERTS, num_hidden_layers=4)
    other_path = str(write_checkpoint(other, tmp_path / "other"))
    trace = tmp_path / "other.trace"
    llm = LLM(other_path, device="cpu", record_routing=str(trace))
    llm.generate(PROMPTS[:1], GREEDY)
    llm.close()
    with pytest.raises(UserError, match="MoE layers"):
        LLM(ckpt, device="cpu", routing_source=f"replay:{trace}")


def _engine_args(argv: list[str]) -> EngineArgs:
    return EngineArgs.from_namespace(build_parser(__version__).parse_args(argv))


def test_cli_flags(ckpt, tmp_path):
    args = _engine_args(
        ["--m", ckpt, "--d", "cpu", "--routing-source", "olmoe", "--routing-seed", "3",
         "--record-routing", str(tmp_path / "t")]
    )  # fmt: skip
    cfg = args.create_engine_config().routing
    assert (cfg.kind, cfg.seed, cfg.record_path) == ("model", 3, str(tmp_path / "t"))
    assert _engine_args(["--m", ckpt]).create_engine_config().routing.is_default
    with pytest.raises(UserError, match="routing source"):
        _engine_args(["--routing-source", "model:1,2"])
