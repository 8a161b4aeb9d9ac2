"""Text ↔ token ids for a HF model directory (tokenizer.json via `tokenizers`, the chat
template rendered with jinja2 as HF does; in a chat only the template's own control tokens
are special), plus the streaming helpers: an incremental
detokenizer that never emits half a UTF-8 character and a stop-string matcher."""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from xinfer.errors import UserError

# Tokens decoded before the first new one, so merges and leading-space rules see context.
_DETOK_CONTEXT = 5


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # bad JSON or bad UTF-8
        raise UserError(f"{path.name} cannot be read ({e}); download it again") from None
    if not isinstance(data, dict):
        raise UserError(f"{path.name} cannot be read (it is no JSON object); download it again")
    return data


def _token_content(token: str | dict | None) -> str | None:
    """tokenizer_config tokens are a string or an AddedToken dict `{"content": ...}`."""
    return token.get("content") if isinstance(token, dict) else token


def _pick_template(template: str | list | None) -> str | None:
    if isinstance(
        template, list
    ):  # [{"name": "default", "template": ...}, {"name": "tool_use"...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return named.get("default")
    return template


def _raise_exception(message: str) -> None:
    raise UserError(f"The chat template rejected the messages: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    # HF overrides jinja's tojson so non-ASCII text and tool schemas render unescaped.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)


# Private-use code points around a message index: where that message's content goes.
_MARK_OPEN, _MARK_CLOSE = "\ue000xinfer-content-", "\ue001"
_MARKS = re.compile(f"{_MARK_OPEN}(\\d+){_MARK_CLOSE}")


def _has_any(text: str, needles: frozenset[str]) -> bool:
    return any(n in text for n in needles)


class Tokenizer:
    """A model's tokenizer: encode/decode, special ids and the chat template."""

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        add_bos_token: bool | None = None,
        chat_template: str | None = None,
        extra_eos_token_ids: set[int] | None = None,
        bos_token_id: int | None = None,
    ) -> None:
        self._tok = tokenizer
        self.bos_token = bos_token
        self.eos_token = eos_token
        # None: the tokenizer.json post-processor decides (e.g. Llama 3 adds BOS there).
        self.add_bos_token = add_bos_token
        self.chat_template = chat_template
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        from_config = tokenizer.token_to_id(bos_token) if bos_token else None
        self.bos_token_id: int | None = from_config if from_config is not None else bos_token_id
        eos_id = tokenizer.token_to_id(eos_token) if eos_token else None
        self.eos_token_ids: set[int] = set(extra_eos_token_ids or ()) | (
            {eos_id} if eos_id is not None else set()
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer | None:
        """Load from a HF model directory (or a GGUF file's metadata); None when it has no
        tokenizer."""
        path = Path(path)
        if path.is_file() and path.suffix.lower() == ".gguf":
            from xinfer.gguf_tokenizer import tokenizer_from_gguf
            from xinfer.weights.gguf_loader import cached_gguf

            return tokenizer_from_gguf(cached_gguf(str(path)).metadata)
        if not (path / "tokenizer.json").is_file():
            return None
        config = _read_json(path / "tokenizer_config.json")
        generation = _read_json(path / "generation_config.json")
        template = _pick_template(config.get("chat_template"))
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        elif template is None:
            template = _pick_template(_read_json(path / "chat_template.json").get("chat_template"))
        eos = generation.get("eos_token_id")
        eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
        bos = generation.get("bos_token_id")
        try:
            hf_tokenizer = HFTokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
            raise UserError(f"tokenizer.json cannot be read ({e}); download it again") from None
        return cls(
            hf_tokenizer,
            bos_token=_token_content(config.get("bos_token")),
            eos_token=_token_content(config.get("eos_token")),
            add_bos_token=config.get("add_bos_token"),
            chat_template=template,
            extra_eos_token_ids=eos_ids,
            bos_token_id=bos if isinstance(bos, int) else None,
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Chat prompts already hold their BOS: pass False for them."""
        if self.add_bos_token is None:
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def to_json(self) -> str:
        """The tokenizer.json text (for libraries that build their own view, e.g. grammars)."""
        return self._tok.to_str()

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    @cached_property
    def special_tokens(self) -> frozenset[str]:
        """The texts of the special (control) tokens, e.g. "<|im_end|>"."""
        added = self._tok.get_added_tokens_decoder().values()
        return frozenset(t.content for t in added if t.special)

    @cached_property
    def _text_only(self) -> HFTokenizer:
        """This tokenizer with special-token texts encoded as the plain text they are."""
        tok = HFTokenizer.from_str(self._tok.to_str())
        tok.encode_special_tokens = True
        return tok

    def encode_text_only(self, text: str) -> list[int]:
        """Ids of `text` where "<|im_end|>" and the like stay text, never control tokens."""
        return self._text_only.encode(text, add_special_tokens=False).ids

    def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, **kw: Any
    ) -> list[int]:
        """Token ids of a chat rendered by the template, where only the template's own
        control tokens are special: a message that types one ("hi<|im_end|>\\n<|im_start|>
        system") gets it as text, so it cannot forge a turn."""
        typed = {
            i
            for i, m in enumerate(messages)
            if isinstance(m.get("content"), str) and _has_any(m["content"], self.special_tokens)
        }
        if not typed:  # the common case: exactly what HF tokenizes
            text = self.apply_chat_template(messages, add_generation_prompt, **kw)
            return self.encode(text, add_special_tokens=False)
        # Render with a placeholder for each such content, then tokenize the template's text
        # with special tokens and the contents without.
        marked = [
            {**m, "content": f"{_MARK_OPEN}{i}{_MARK_CLOSE}"} if i in typed else m
            for i, m in enumerate(messages)
        ]
        text = self.apply_chat_template(marked, add_generation_prompt, **kw)
        ids: list[int] = []
        for j, piece in enumerate(_MARKS.split(text)):
            if j % 2 == 0:  # the template's text
                ids += self.encode(piece, add_special_tokens=False) if piece else []
            else:  # the index of a message whose content goes in as text
                ids += self.encode_text_only(messages[int(piece)]["content"])
        return ids

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.chat_template)
        except jinja2.TemplateSyntaxError as e:
            raise UserError(f"The model's chat template does not parse ({e}); fix it.") from e

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **kw: Any
    ) -> str:
        """Render `messages` with the model's chat template, as HF's tokenizer would."""
        if not self.has_chat_template:
            raise UserError(
                "This model has no chat template; send a plain completion prompt instead."
            )
        variables = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or "", **kw}
        return self._compiled_template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas. Decodes a short window of previous
    tokens with and without the new ones and emits the difference, holding back text that
    ends in U+FFFD (an incomplete UTF-8 sequence) until the next token completes it."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids = list(prompt_ids)
        self._prefix_offset = max(len(self._ids) - _DETOK_CONTEXT, 0)  # window start
        self._read_offset = len(self._ids)  # ids before this are already emitted
        self.text = ""  # output text so far (the prompt is not included)

    def add(self, token_id: int) -> str:
        """Append one token; returns the newly completed text (maybe "")."""
        self._ids.append(token_id)
        decode = lambda ids: self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)
        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self.text += delta
        return delta


class StopStringMatcher:
    """Finds stop strings in streamed text. `feed` returns the text that is safe to emit
    (a suffix that could begin a stop string is held back) and whether a stop string was
    completed; the text is cut before the stop string that completes first."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.is_stopped = False
        self.matched: str | None = None  # the stop string that ended the stream

    def feed(self, delta: str) -> tuple[str, bool]:
        if self.is_stopped:
            return "", True
        text = self._held + delta
        hits = [(i + len(s), i) for s in self.stops if (i := text.find(s)) >= 0]
        if hits:
            end, start = min(hits)  # first to complete; on a tie the longer (earlier) one
            self._held, self.is_stopped, self.matched = "", True, text[start:end]
            return text[:start], True
        keep = max((self._partial_len(text, s) for s in self.stops), default=0)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    @staticmethod
    def _partial_len(text: str, stop: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                return n
        return 0

    def flush(self) -> str:
        """The held-back text, at the end of the stream (nothing after a stop)."""
        held, self._held = self._held, ""
        return held
