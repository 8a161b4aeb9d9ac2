"""Tests for xinfer.tokenizer on a tiny byte-level BPE trained in the test: encode/decode,
the ChatML chat template (also against transformers), eos ids, incremental detokenization
of multi-byte text, and the stop-string matcher over every way of splitting a stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from xinfer.errors import UserError
from xinfer.tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TEXTS = [
    "hello world",
    "café naïve über Ærøskøbing",
    "日本語のテキストです",
    "emoji 😀🎉👍🏽 and 👨‍👩‍👧 family",
    "mixed: 안녕 мир ✓ ½ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
]


def write_model_dir(path: Path, config: dict, generation: dict | None = None) -> Path:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(
        TEXTS * 5 + ["the quick brown fox jumps over the lazy dog"] * 5, trainer
    )
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return path


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    config = {
        "eos_token": {"content": "<|im_end|>", "special": True},
        "bos_token": None,
        "chat_template": CHATML,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return write_model_dir(tmp_path / "model", config, {"eos_token_id": [0, 2]})


@pytest.fixture
def tokenizer(model_dir: Path) -> Tokenizer:
    tok = Tokenizer.from_dir(model_dir)
    assert tok is not None
    return tok


def test_from_dir_without_tokenizer_json(tmp_path: Path):
    assert Tokenizer.from_dir(tmp_path) is None


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_damaged_tokenizer_files_are_one_sentence(model_dir: Path, name: str):
    """A damaged tokenizer.json or tokenizer_config.json crashed with the parser's error."""
    (model_dir / name).write_text('{"model": ')
    with pytest.raises(UserError, match=f"{name} cannot be read"):
        Tokenizer.from_dir(model_dir)


@pytest.mark.parametrize("text", TEXTS + ["", "unseen words 🦜 ẞ"])
def test_encode_decode_roundtrip(tokenizer: Tokenizer, text: str):
    ids = tokenizer.encode(text)
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text


def test_special_ids_and_bos(tokenizer: Tokenizer, tmp_path: Path):
    assert tokenizer.vocab_size == 320
    assert tokenizer.bos_token_id is None
    assert tokenizer.eos_token_ids == {0, 2}  # tokenizer_config's <|im_end|> ∪ generation_config
    assert tokenizer.encode("hello")[0] != 3
    with_bos = write_model_dir(
        tmp_path / "bos",
        {"bos_token": {"content": "<s>"}, "eos_token": "<|endoftext|>", "add_bos_token": True},
        {"eos_token_id": 2},
    )
    tok = Tokenizer.from_dir(with_bos)
    assert tok.bos_token_id == 3 and tok.eos_token_ids == {0, 2}
    assert tok.encode("hello")[0] == 3 and tok.encode("hello", add_special_tokens=False)[0] != 3
    assert tok.decode(tok.encode("hello")) == "hello"
    assert tok.decode(tok.encode("hello"), skip_special_tokens=False) == "<s>hello"
    assert not tok.has_chat_template
    with pytest.raises(UserError):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_chatml_rendering(tokenizer: Tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi 😀"},
    ]
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 😀<|im_end|>\n"
    assert tokenizer.has_chat_template
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False) == expected
    prompt = tokenizer.apply_chat_template(messages)
    assert prompt == expected + "<|im_start|>assistant\n"
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|>, <|im_end|> stay single tokens


FANCY_TEMPLATE = """{{ bos_token }}
{% for m in messages %}
  {% if m['role'] not in ['user', 'assistant'] %}
    {{ raise_exception('roles must be user or assistant') }}
  {% endif %}
  [{{ m['role'] }}] {{ m['content'] | tojson }}
  {% if loop.last %}{{ eos_token }}{% endif %}
{% endfor %}
{% if tools %}tools={{ tools | tojson }}{% endif %}
{% if add_generation_prompt %}[assistant]{% endif %}"""


def test_template_variants_match_transformers(model_dir: Path):
    transformers = pytest.importorskip("transformers")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.update(eos_token="<|im_end|>", bos_token="<s>")
    config["chat_template"] = [
        {"name": "tool_use", "template": "unused"},
        {"name": "default", "template": FANCY_TEMPLATE},
    ]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    ours = Tokenizer.from_dir(model_dir)
    config["chat_template"] = FANCY_TEMPLATE  # transformers 5 reads only the string form
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    theirs = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    messages = [{"role": "user", "content": 'héllo "x"'}, {"role": "assistant", "content": "日本"}]
    tools = [{"name": "f", "description": "ünïcode"}]
    for gen in (True, False):
        for kw in ({}, {"tools": tools}):
            expected = theirs.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=gen, **kw
            )
            assert ours.apply_chat_template(messages, add_generation_prompt=gen, **kw) == expected
    with pytest.raises(UserError, match="roles must be user or assistant"):
        ours.apply_chat_template([{"role": "system", "content": "x"}])
    (model_dir / "chat_template.jinja").write_text("{{ messages | length }}")
    assert Tokenizer.from_dir(model_dir).apply_chat_template(messages) == "2"


@pytest.mark.parametrize("skip_special", [True, False])
@pytest.mark.parametrize("text", TEXTS + ["🦜ẞ🦜 € 한국어 ok", "⚡" * 7])
def test_incremental_detokenizer(tokenizer: Tokenizer, text: str, skip_special: bool):
    prompt = tokenizer.encode("the prompt 日本")
    ids = tokenizer.encode(text)
    # A special token mid-stream, at a character boundary (inside one it breaks the bytes).
    cut = next(
        k for k in range(len(ids) // 2, len(ids)) if "\ufffd" not in tokenizer.decode(ids[:k])
    )
    ids = ids[:cut] + [2] + ids[cut:]
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=skip_special)
    deltas = []
    num_held = 0
    for i, token_id in enumerate(ids, 1):
        delta = detok.add(token_id)
        assert "\ufffd" not in delta
        deltas.append(delta)
        full = tokenizer.decode(ids[:i], skip_special_tokens=skip_special)
        if full.endswith("\ufffd"):  # an incomplete character: it (and its token) wait
            num_held += 1
            assert full.startswith(detok.text)
        else:
            assert detok.text == full
        assert "".join(deltas) == detok.text
    assert detok.text == tokenizer.decode(ids, skip_special_tokens=skip_special)
    if any(ord(c) > 0x7FF for c in text):
        assert num_held > 0  # the tiny vocab does split some characters across tokens


def cut_at_first_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """Reference: the stop string that completes first (then the longer one) wins."""
    hits = [(i + len(s), i) for s in stops if s and (i := text.find(s)) >= 0]
    return (text[: min(hits)[1]], True) if hits else (text, False)


def stream(stops: list[str], chunks: list[str]) -> tuple[str, bool]:
    matcher = StopStringMatcher(stops)
    out, stopped = [], False
    for chunk in chunks:
        emitted, stopped = matcher.feed(chunk)
        out.append(emitted)
        if stopped:
            break
    if not stopped:
        out.append(matcher.flush())
    return "".join(out), stopped


@pytest.mark.parametrize(
    "text,stops",
    [
        ("Hello world. STOP here", ["STOP"]),
        ("aaab", ["aab"]),
        ("no stop at all", ["xyz", "zz"]),
        ("abcd", ["abcd", "c"]),
        ("x<|im_end|>y</s>", ["</s>", "<|im_end|>"]),
        ("日本語😀終わり", ["😀終"]),
        ("ababac", ["abac", "bab"]),
    ],
)
def test_stop_matcher_every_split(text: str, stops: list[str]):
    expected = cut_at_first_stop(text, stops)
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert stream(stops, [text[:i], text[i:j], text[j:]]) == expected
    if expected[1] and len(stops) == 1:
        assert expected[0] == text[: text.find(stops[0])]


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab c", max_size=24),
    stops=st.lists(st.text(alphabet="ab c", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 24), max_size=6),
)
def test_stop_matcher_random_splits(text: str, stops: list[str], cuts: list[int]):
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert stream(stops, chunks) == cut_at_first_stop(text, stops)


def test_stop_matcher_holds_back_and_stays_stopped():
    matcher = StopStringMatcher(["</end>"])
    assert matcher.feed("abc</e") == ("abc", False)
    assert matcher.feed("x") == ("</ex", False)
    assert matcher.feed("</en") == ("", False)
    assert matcher.flush() == "</en"
    matcher = StopStringMatcher(["</end>"])
    assert matcher.feed("a</end>b") == ("a", True)
    assert matcher.feed("more") == ("", True) and matcher.flush() == ""
