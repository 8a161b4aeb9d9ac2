"""A tiny random qwen3_moe checkpoint with a real (small, byte-level BPE) tokenizer, a ChatML
chat template and eos "<|im_end|>", for the server tests and manual runs:
`python tests/chat_model.py DIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# ChatML that also renders tools the way Qwen2.5 / Qwen3 templates do (a short system block
# listing them, assistant `<tool_call>` JSON, tool results as `<tool_response>` user turns). Without
# tools it renders exactly as CHATML.
TOOLS_CHATML = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    '{{- \'\\n</tools>\\nCall one as <tool_call>\\n{\\"name\\": ..., '
    '\\"arguments\\": {...}}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant\\n' + message['content'] }}"
    "{%- for call in message['tool_calls'] %}"
    "{{- '<tool_call>\\n{\\\"name\\\": \\\"' + call['function']['name'] + '\\\", "
    "\\\"arguments\\\": ' + (call['function']['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Mixture-of-experts models route every token to a few experts.",
    "Hello! How are you today? I am fine, thank you.",
    "Inference servers batch requests continuously and stream tokens back.",
    "café naïve über 日本語 😀 ✓",
    "one two three four five six seven eight nine ten",
]


def write_tokenizer(path: Path, vocab_size: int = 384, chat_template: str = CHATML) -> int:
    """Train a byte-level BPE on TEXT, write the tokenizer files; returns its vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXT * 20, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    config = {
        "eos_token": "<|im_end|>",
        "bos_token": None,
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": chat_template,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    eos = tok.token_to_id("<|im_end|>")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return tok.get_vocab_size(with_added_tokens=True)


def write_chat_model(path: Path, chat_template: str = CHATML) -> Path:
    """A 2-layer hidden-64 qwen3_moe whose vocab matches the tokenizer."""
    from tiny_models import make_hf_model, write_checkpoint

    path = Path(path)
    vocab = write_tokenizer(path, chat_template=chat_template)
    # initializer_range 0.3: peaked logits, so greedy text varies and has no near-ties
    model = make_hf_model(
        "qwen3_moe",
        vocab_size=vocab,
        num_hidden_layers=2,
        mlp_only_layers=[],
        initializer_range=0.3,
        max_position_embeddings=1024,  # room for a tools prompt (the vocab is tiny)
    )
    write_checkpoint(model, path)
    return path


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    print(write_chat_model(Path(sys.argv[1])))
