"""Checks the bundled demo model's files without xinfer's loader: shapes, tokenizer, template.

The assets are produced by ``scripts/train_demo.py``; these tests catch a stale or partial
re-run (missing files, oversized weights, a model that did not learn) before it is committed.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import jinja2
import pytest
from tokenizers import Tokenizer

DEMO_DIR = Path(__file__).resolve().parents[2] / "src/xinfer/assets/demo"
LOSS_PLOT = Path(__file__).resolve().parents[2] / "docs/demo_loss.png"
EXPECTED_FILES = {
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "model_card.md",
    "metrics.json",
    "train_log.json",
}
MAX_WEIGHTS_BYTES = 20 * 1000 * 1000


def _json(name: str) -> dict:
    return json.loads((DEMO_DIR / name).read_text())


def test_directory_holds_exactly_the_demo_files() -> None:
    assert {p.name for p in DEMO_DIR.iterdir()} == EXPECTED_FILES
    assert LOSS_PLOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_weights_are_small_bf16_safetensors_with_per_expert_names() -> None:
    path = DEMO_DIR / "model.safetensors"
    assert path.stat().st_size <= MAX_WEIGHTS_BYTES
    # safetensors layout: u64 little-endian header length, then a JSON header.
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert {v["dtype"] for v in tensors.values()} == {"BF16"}
    config = _json("config.json")
    for layer in range(config["num_hidden_layers"]):
        for expert in range(config["num_experts"]):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                name = f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
                assert name in tensors, name
    gate = tensors["model.layers.0.mlp.experts.0.gate_proj.weight"]
    assert gate["shape"] == [config["moe_intermediate_size"], config["hidden_size"]]
    assert tensors["model.embed_tokens.weight"]["shape"] == [
        config["vocab_size"],
        config["hidden_size"],
    ]


def test_config_is_a_top2_qwen3_moe_with_at_least_8_experts() -> None:
    config = _json("config.json")
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert config["model_type"] == "qwen3_moe"
    assert config["num_experts"] >= 8
    assert config["num_experts_per_tok"] == 2
    assert config["num_attention_heads"] * config["head_dim"] > 0


def test_tokenizer_and_generation_config_agree_on_special_tokens() -> None:
    tokenizer = Tokenizer.from_file(str(DEMO_DIR / "tokenizer.json"))
    im_end, eot = tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")
    assert None not in (im_end, eot, tokenizer.token_to_id("<|im_start|>"))
    assert tokenizer.get_vocab_size() == _json("config.json")["vocab_size"]
    assert _json("generation_config.json")["eos_token_id"] == [im_end, eot]
    tok_config = _json("tokenizer_config.json")
    assert tok_config["eos_token"] == "<|im_end|>"
    assert tok_config["bos_token"] is None and tok_config["add_bos_token"] is False
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


@pytest.mark.parametrize("source", ["tokenizer_config.json", "chat_template.jinja"])
def test_chat_template_renders_chatml(source: str) -> None:
    if source == "chat_template.jinja":
        template_text = (DEMO_DIR / source).read_text()
    else:
        template_text = _json(source)["chat_template"]
    template = jinja2.Environment().from_string(template_text)
    messages = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Reverse a list."},
    ]
    rendered = template.render(messages=messages, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nYou write Python.<|im_end|>\n"
        "<|im_start|>user\nReverse a list.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    tokenizer = Tokenizer.from_file(str(DEMO_DIR / "tokenizer.json"))
    ids = tokenizer.encode(rendered).ids
    assert ids.count(tokenizer.token_to_id("<|im_start|>")) == 3
    assert ids.count(tokenizer.token_to_id("<|im_end|>")) == 2


def test_model_learned_far_better_than_unigram() -> None:
    metrics = _json("metrics.json")
    assert metrics["heldout_ppl"] * 5 <= metrics["unigram_ppl"]
    card = (DEMO_DIR / "model_card.md").read_text()
    assert f"{metrics['heldout_ppl']:.2f}" in card
    assert "PSF-2.0" in card
    log = _json("train_log.json")
    assert log[-1]["loss"] < log[0]["loss"]
