"""The `xinfer` command end to end (subprocess): one-shot generation, and every user
mistake ends with exit code 2 and one clear line on stderr, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import tiny_models as tm


def run_cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xinfer.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tm.write_checkpoint(tm.make_hf_model("qwen3_moe"), tmp_path_factory.mktemp("cli"))


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """A tiny model with a trained tokenizer and a ChatML template, for text prompts."""
    from chat_model import write_chat_model

    return write_chat_model(tmp_path_factory.mktemp("chat"))


def _assert_user_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("xinfer: error:")]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0], lines[0]


def test_missing_path():
    _assert_user_error(
        run_cli("--m", "/no/such/model", "--prompt", "hi", "--d", "cpu"), "does not exist"
    )


def test_dir_without_config(tmp_path):
    _assert_user_error(run_cli("--m", str(tmp_path), "--prompt", "hi", "--d", "cpu"), "config.json")


def test_unknown_architecture(tmp_path):
    cfg = {
        "architectures": ["GPT2LMHeadModel"],
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "vocab_size": 10,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    proc = run_cli("--m", str(tmp_path), "--prompt", "hi", "--d", "cpu")
    _assert_user_error(proc, "Qwen3MoeForCausalLM")


def test_bad_dtype(tiny_dir):
    _assert_user_error(run_cli("--m", str(tiny_dir), "--dtype", "int3", "--prompt", "x"), "dtype")


def test_bad_option_value(tiny_dir):
    proc = run_cli("--m", str(tiny_dir), "--d", "cpu", "--prompt", "x", "--temperature", "-1")
    _assert_user_error(proc, "temperature")


def test_empty_prompt(tiny_dir):
    _assert_user_error(run_cli("--m", str(tiny_dir), "--d", "cpu", "--prompt", "  "), "empty")


def test_text_prompt_without_tokenizer(tiny_dir):
    proc = run_cli("--m", str(tiny_dir), "--d", "cpu", "--prompt", "hello")
    _assert_user_error(proc, "tokenizer")


def test_prompt_longer_than_max_model_len(chat_dir):
    proc = run_cli(
        "--m", str(chat_dir), "--d", "cpu", "--max-model-len", "8", "--prompt", "word " * 50
    )
    _assert_user_error(proc, "max-model-len")


def test_one_shot_generation_streams(chat_dir):
    proc = run_cli(
        "--m", str(chat_dir), "--d", "cpu", "--prompt", "Hello!", "--max-tokens", "12",
        "--ignore-eos",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip(), "no completion was printed"
    assert "12 tokens" in proc.stderr


def test_interactive_chat_keeps_the_conversation(chat_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "xinfer.cli", "--m", str(chat_dir), "--d", "cpu", "--chat",
         "--max-tokens", "6"],
        input="hello\n/reset\nagain\n/exit\n",
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("> ") == 4  # a prompt before each of the four lines


def test_chat_message_over_the_context_is_dropped_and_the_chat_goes_on(chat_dir):
    """A message that takes the conversation past --max-model-len ended the chat (and lost
    the conversation); now it is refused in one line and the chat goes on."""
    proc = subprocess.run(
        [sys.executable, "-m", "xinfer.cli", "--m", str(chat_dir), "--d", "cpu", "--chat",
         "--max-model-len", "64", "--max-tokens", "4"],
        input="word " * 100 + "\nhello\n/exit\n",
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("xinfer: error:")]
    assert len(errors) == 1 and "max-model-len" in errors[0] and "dropped" in errors[0], errors
    assert proc.stdout.count("> ") == 3  # asked again after the error, and after the answer
