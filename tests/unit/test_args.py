"""The one options object: the command line and `LLM(...)` are built from the same
declarations (so they cannot drift), every option has help, values are validated with one
clear sentence, flags win over their variables, unimplemented values are refused, and
`--max-model-len` above the model's maximum needs the explicit override."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch
from tiny_models import make_hf_model, write_checkpoint

from xinfer import LLM, SamplingParams, UserError, __version__, cli
from xinfer.args import EngineArgs
from xinfer.cli_args import OPTION_SETS, build_parser
from xinfer.config import ModelConfig
from xinfer.engine.engine import model_max_len


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("XINFER_MOE_OFFLOAD", "XINFER_MOE_OFFLOAD_RESERVE_GB",
                 "XINFER_MOE_OFFLOAD_PROFILE", "XINFER_LOG_LEVEL"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(write_checkpoint(make_hf_model("qwen3_moe"), tmp_path_factory.mktemp("args")))


def parse_engine_args(*argv: str) -> EngineArgs:
    return EngineArgs.from_namespace(build_parser(__version__).parse_args(list(argv)))


def test_every_option_has_help_and_the_parser_is_unambiguous():
    parser = build_parser(__version__)
    flags = [s for a in parser._actions for s in a.option_strings]
    assert len(flags) == len(set(flags))
    for action in parser._actions:
        assert action.help and action.help.strip(), action.option_strings
    assert "--moe-prefetch-margin" in parser.format_help()  # argparse %-formats every help
    for option_set in OPTION_SETS:
        for f, _ in option_set.options():
            assert f.metadata["help"], f.name


def test_every_engine_option_is_a_flag_and_an_llm_keyword():
    """The drift the issue found: --gpu-memory-utilization / --max-waiting only on the CLI,
    num_kv_blocks / decode_look_ahead only in LLM."""
    parser = build_parser(__version__)
    dests = {a.dest for a in parser._actions}
    names = [f.name for f in dataclasses.fields(EngineArgs)]
    for name in names:
        assert name in dests, f"{name} has no command-line flag"
    for name in ("gpu_memory_utilization", "max_waiting", "num_kv_blocks", "decode_look_ahead"):
        assert name in names
    kwargs = dict(
        gpu_memory_utilization=0.5,
        max_waiting=7,
        num_kv_blocks=9,
        decode_look_ahead=False,
        block_size=8,
        max_num_seqs=3,
        kv_cache_dtype="fp8",
        device="cpu",
        moe_offload="0.5",
    )
    from_cli = parse_engine_args(
        "--gpu-memory-utilization", "0.5", "--max-waiting", "7", "--num-kv-blocks", "9",
        "--no-decode-look-ahead", "--block-size", "8", "--max-num-seqs", "3",
        "--kvcache-dtype", "fp8", "--d", "cpu", "--moe-offload", "0.5",
    )  # fmt: skip
    from_python = EngineArgs.from_kwargs(**kwargs)
    assert from_cli == from_python
    config = from_python.create_engine_config()
    assert config == from_cli.create_engine_config()
    assert config.cache.gpu_memory_utilization == 0.5 and config.cache.num_blocks == 9
    assert config.scheduler.max_waiting == 7 and config.decode_look_ahead is False
    assert config.cache.kv_dtype == torch.float8_e4m3fn and config.offload.fraction == 0.5


def test_each_keyword_is_a_flag_and_the_readme_lists_every_flag():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for option_set in OPTION_SETS:
        for f, _ in option_set.options():
            spellings = f.metadata["flags"] or (option_set.flag(f.name),)
            assert "--" + f.name.replace("_", "-") in spellings, f.name
            assert f"`{spellings[0]}" in readme or f"[no-]{spellings[0][2:]}" in readme, f.name


def test_llm_takes_the_cli_only_options(tiny_dir):
    llm = LLM(tiny_dir, device="cpu", gpu_memory_utilization=0.5, max_waiting=3, num_kv_blocks=40)
    assert llm.engine.config.scheduler.max_waiting == 3
    assert llm.engine.config.cache.gpu_memory_utilization == 0.5
    assert llm.engine.kv_tokens == 40 * 16


def test_unknown_llm_keyword_names_the_closest_option():
    with pytest.raises(UserError, match="did you mean 'max_num_seqs'"):
        LLM("demo", device="cpu", max_num_seq=4)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(max_num_seqs="8"), "--max-num-seqs must be an integer"),
        (dict(max_num_seqs=0), "--max-num-seqs must be >= 1, got 0"),
        (dict(gpu_memory_utilization=1.5), "--gpu-memory-utilization must be in"),
        (dict(block_size=12), "power of two"),
        (dict(enforce_eager="yes"), "must be true or false"),
        (dict(load_format="pt"), "--load-format must be one of auto, dummy"),
        (dict(dtype="int3"), "unknown dtype"),
        (dict(kv_cache_dtype="int4"), "fp8, turbo4 or turbo3"),
        (dict(moe_offload=1.5), r"\(0, 1\]"),
        (dict(device="cpu,0"), "tensor parallelism needs one kind"),
        (dict(isq="q3k"), "--isq must be one of q8_0, q4k, q6k, q4_0"),
        (dict(num_speculative_tokens=2), "speculative decoding"),
        (dict(max_model_len=float("nan")), "must be an integer"),
        # inf passed every bound and crashed later (int(inf * GIB)) or was taken as given
        (dict(gpu_memory_limit_gb=float("inf")), "--gpu-memory-limit-gb must be a number"),
        (dict(moe_offload="auto", moe_offload_reserve_gb=float("inf")), "must be a number"),
        (dict(log_stats_interval=float("-inf")), "--log-stats-interval must be a number"),
    ],
)
def test_bad_values_are_one_sentence(kwargs, needle):
    with pytest.raises(UserError, match=needle):
        EngineArgs.from_kwargs(**kwargs)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_variable_is_one_sentence(value, monkeypatch):
    """XINFER_MOE_OFFLOAD_RESERVE_GB=nan or inf passed and crashed in the slot sizing."""
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_RESERVE_GB", value)
    with pytest.raises(UserError, match="XINFER_MOE_OFFLOAD_RESERVE_GB must be a number"):
        EngineArgs(moe_offload="auto").offload_config()


def test_reserve_applies_to_auto_only(monkeypatch, caplog):
    """--moe-offload-reserve-gb sizes what `auto` leaves free: given without offload or with
    a fraction it was dropped silently; now refused. The variable, exported for every run,
    is dropped with a warning, as the other offload variables are."""
    for offload in (None, 0.5):
        with pytest.raises(UserError, match="reserve-gb 1 sizes .* it needs --moe-offload auto"):
            EngineArgs(moe_offload=offload, moe_offload_reserve_gb=1.0).offload_config()
    assert EngineArgs(moe_offload="auto", moe_offload_reserve_gb=1.0).offload_config().is_auto
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_RESERVE_GB", "4")
    for offload in (None, 0.5):
        caplog.clear()
        with caplog.at_level("WARNING", logger="xinfer"):
            EngineArgs(moe_offload=offload).offload_config()
        assert "XINFER_MOE_OFFLOAD_RESERVE_GB=4 has no effect without --moe-offload auto" in (
            caplog.text
        )
    caplog.clear()
    with caplog.at_level("WARNING", logger="xinfer"):
        assert EngineArgs(moe_offload="auto").offload_config().reserve_gb == 4.0
    assert "has no effect" not in caplog.text


def test_gpu_memory_options_on_cpu_say_they_do_nothing(caplog):
    """They size GPU memory; on cpu they were dropped silently (the limit still sizes MoE
    offload's slots there, so with offload it is used and nothing is said)."""
    for kw, said in (
        (dict(gpu_memory_limit_gb=4.0), "--gpu-memory-limit-gb 4 has no effect on cpu"),
        (dict(gpu_memory_utilization=0.5), "--gpu-memory-utilization 0.5 has no effect on cpu"),
        (dict(gpu_memory_limit_gb=4.0, moe_offload="auto"), None),
        (dict(), None),
    ):
        caplog.clear()
        with caplog.at_level("WARNING", logger="xinfer"):
            EngineArgs(device="cpu", **kw).create_engine_config()
        assert (said in caplog.text) if said else "no effect" not in caplog.text, caplog.text


def test_flag_wins_over_its_variable(monkeypatch):
    monkeypatch.setenv("XINFER_MOE_OFFLOAD", "0.25")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_RESERVE_GB", "4")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_PROFILE", "1")
    from_env = parse_engine_args().offload_config()
    assert (from_env.fraction, from_env.reserve_gb, from_env.is_profile) == (0.25, 4.0, True)
    flags = parse_engine_args(
        "--moe-offload", "auto", "--moe-offload-reserve-gb", "1", "--no-moe-offload-profile"
    ).offload_config()
    assert (flags.is_auto, flags.reserve_gb, flags.is_profile) == (True, 1.0, False)


def test_max_model_len_above_the_models_needs_the_override(tiny_dir):
    with pytest.raises(UserError, match="above this model's maximum of 512"):
        LLM(tiny_dir, device="cpu", max_model_len=1_000_000)
    llm = LLM(tiny_dir, device="cpu", max_model_len=1024, allow_long_max_model_len=True)
    assert llm.engine.max_model_len == 1024
    assert LLM(tiny_dir, device="cpu", max_model_len=100).engine.max_model_len == 100


def test_too_few_kv_blocks_names_the_option(tiny_dir):
    """Blocks given with --num-kv-blocks: the fix is more blocks (it said "free memory")."""
    with pytest.raises(UserError, match=r"fits 16 tokens.*raise --num-kv-blocks \(32 hold one"):
        LLM(tiny_dir, device="cpu", num_kv_blocks=1)


def test_model_max_len_counts_rope_scaling(tiny_dir, tmp_path):
    plain = ModelConfig.from_dir(tiny_dir)
    assert model_max_len(plain) == 512
    linear = ModelConfig.from_dir(write_checkpoint(make_hf_model("olmoe"), tmp_path))
    assert model_max_len(linear) == 1024  # factor 2
    yarn = dict(plain.hf_config, rope_scaling=None)
    yarn["rope_parameters"] = {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
        "rope_theta": 10000.0,
    }  # fmt: skip
    assert model_max_len(ModelConfig.from_hf(yarn)) == 1024


def test_sampling_n_gives_n_sequences(tiny_dir):
    llm = LLM(tiny_dir, device="cpu")
    prompt = [5, 6, 7, 8]
    sampled = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    [result] = llm.generate([prompt], sampled)
    assert [o.index for o in result.outputs] == [0, 1, 2]
    for i, out in enumerate(result.outputs):
        alone = dataclasses.replace(sampled, n=1, seed=11 + i)
        assert out.token_ids == llm.generate([prompt], alone)[0].token_ids
        assert out.finish_reason == "length"
    assert len({tuple(o.token_ids) for o in result.outputs}) > 1  # different seeds differ
    greedy = SamplingParams(n=2, temperature=0.0, max_tokens=5, ignore_eos=True)
    a, b = llm.generate([prompt, [9, 10]], greedy)
    assert len(a.outputs) == len(b.outputs) == 2
    assert a.outputs[0].token_ids == a.outputs[1].token_ids == a.token_ids


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"xinfer {__version__}"


@pytest.mark.parametrize(
    "argv, env, needle",
    [
        (["--log-level", "verbose"], None, "--log-level must be one of debug, info"),
        (["--prompt", "hi"], "loud", "XINFER_LOG_LEVEL must be one of debug"),
        (["--max-num-seqs", "x"], None, "--max-num-seqs: invalid int value"),
        (["--max-model-len", "1000000", "--prompt", "hi", "--d", "cpu"], None, "maximum of 2048"),
        (["--temperature", "-1", "--prompt", "hi"], None, "temperature must be >= 0"),
        (["--moe-offload", "auto", "--moe-offload-reserve-gb", "inf"], None, "a number"),
        (["--gpu-memory-limit-gb", "nan"], None, "--gpu-memory-limit-gb must be a number"),
        # each of these ran with the option dropped silently
        (["--prompt", "hi", "--chat", "--d", "cpu", "--max-tokens", "2"], None, "one of them"),
        (["--m", " ", "--prompt", "hi"], None, "--m is empty"),  # was "'.' has no config.json"
        (["--served-model-name", "", "--host", "256.0.0.1"], None, "--served-model-name must"),
        (["--temperature", "0.7", "--host", "256.0.0.1"], None, "--temperature sets the sam"),
        (["--stop", "x", "--host", "256.0.0.1"], None, "server takes sampling per request"),
        (["--prompt", "hi", "--d", "cpu", "--max-tokens", "2", "--ui-server"], None, "--ui-s"),
        (["--prompt", "hi", "--d", "cpu", "--max-tokens", "2", "--port", "9"], None, "--port "),
    ],
)
def test_cli_mistakes_are_one_line(argv, env, needle, capsys, monkeypatch):
    if env is not None:
        monkeypatch.setenv("XINFER_LOG_LEVEL", env)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("xinfer: error:") and needle in err[0], err


def test_log_level_is_case_insensitive(monkeypatch):
    from xinfer.cli_args import RunArgs

    ns = build_parser(__version__).parse_args(["--log-level", "DEBUG"])
    assert RunArgs.from_namespace(ns).logging_level == 10
    monkeypatch.setenv("XINFER_LOG_LEVEL", "Warning")
    ns = build_parser(__version__).parse_args([])
    assert RunArgs.from_namespace(ns).logging_level == 30
    assert isinstance(ns, argparse.Namespace)
