"""Writes a small trained byte-level BPE tokenizer (with a ChatML template) into a tiny
checkpoint directory, so that text prompts work in tests."""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_TEXT = [
    "def main():\n    print('hello world')\n",
    "import os\nimport sys\n\nfor i in range(10):\n    x = i * 2\n",
    "The quick brown fox jumps over the lazy dog. Über naïve café, 日本語, emoji 🙂.\n",
    "class Foo:\n    def __init__(self, a, b):\n        self.a = a\n        self.b = b\n",
] * 50


def write_tokenizer(path: Path, vocab_size: int = 512) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_TEXT, trainer)
    tok.save(str(path / "tokenizer.json"))
    cfg = {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHATML}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
