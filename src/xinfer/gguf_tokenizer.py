"""The tokenizer of a GGUF file, built with `tokenizers` from its metadata: gpt2-style
byte-level BPE (`tokenizer.ggml.model = gpt2`: tokens + merges + a pre-tokenizer regex named
by `tokenizer.ggml.pre`) or SentencePiece BPE (`llama`: tokens + scores, merges derived from
the scores as SentencePiece applies them, byte fallback). Control tokens become special
tokens, user-defined ones plain added tokens (llama.cpp matches both whole); the chat
template is `tokenizer.chat_template`."""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from xinfer.errors import UserError
from xinfer.tokenizer import Tokenizer

_CONTROL, _USER_DEFINED = 3, 4
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` → (split regex, NFC-normalise first)
_PRE: dict[str, tuple[str, bool]] = {
    "default": (_GPT2, False),
    "gpt-2": (_GPT2, False),
    "olmo": (_GPT2, False),
    "qwen2": (_QWEN2, True),
    "llama-bpe": (_LLAMA3, False),
    "llama3": (_LLAMA3, False),
}


def _byte_level_bpe(meta: dict[str, Any], tokens: list[str]) -> HFTokenizer:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE:
        raise UserError(
            f"GGUF pre-tokenizer {pre!r} is not supported; supported: {', '.join(sorted(_PRE))}"
        )
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = HFTokenizer(BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    pattern, nfc = _PRE[pre]
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def spm_merges(
    tokens: list[str], scores: list[float], is_mergeable: list[bool]
) -> list[tuple[str, str]]:
    """SentencePiece BPE merges a pair when the merged piece has the best score; as BPE
    ranks: every (left, right) split of a mergeable piece, by the piece's score."""
    vocab = {t: i for i, t in enumerate(tokens) if is_mergeable[i]}
    found = []
    for piece, score, ok in zip(tokens, scores, is_mergeable):
        for cut in range(1, len(piece) if ok else 0):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                found.append((-score, vocab[left], vocab[right], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def _sentencepiece(meta: dict[str, Any], tokens: list[str]) -> HFTokenizer:
    scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    # only normal and byte pieces take part in merges; specials are matched whole
    mergeable = [ty in (1, 6) for ty in types]
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    tok = HFTokenizer(
        BPE(
            vocab,
            spm_merges(tokens, scores, mergeable),
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend("▁")] if add_prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if add_prefix else [])
    )
    return tok


def tokenizer_from_gguf(meta: dict[str, Any]) -> Tokenizer | None:
    """None when the file carries no vocabulary."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        return None
    kind = meta.get("tokenizer.ggml.model", "gpt2")
    builders = {"gpt2": _byte_level_bpe, "llama": _sentencepiece}
    if kind not in builders:
        raise UserError(
            f"GGUF tokenizer model {kind!r} is not supported; supported: {', '.join(builders)}"
        )
    backend = builders[kind](meta, tokens)
    types = meta.get("tokenizer.ggml.token_type") or []
    backend.add_special_tokens(
        [
            AddedToken(tokens[i], normalized=False, special=True)
            for i, t in enumerate(types)
            if t == _CONTROL
        ]
    )
    backend.add_tokens(
        [AddedToken(tokens[i], normalized=False) for i, t in enumerate(types) if t == _USER_DEFINED]
    )

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    eot = meta.get("tokenizer.ggml.eot_token_id")
    return Tokenizer(
        backend,
        bos_token=token("bos"),
        eos_token=token("eos"),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=meta.get("tokenizer.chat_template"),
        extra_eos_token_ids={eot} if eot is not None else set(),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
    )
