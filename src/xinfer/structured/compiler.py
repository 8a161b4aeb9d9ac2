"""llguidance bound to one model: `GrammarCompiler` holds the llguidance view of the tokenizer
(built once; its first mask computation warms internal tables) and turns a `GrammarSpec` into
a checked per-request `GrammarMatcher`, the grammar's state as output tokens arrive."""

from __future__ import annotations

import threading

import llguidance
import torch

from xinfer.errors import UserError
from xinfer.structured.spec import GrammarSpec
from xinfer.tokenizer import Tokenizer

_MAX_ERROR_CHARS = 400


class GrammarMatcher:
    """One request's position in its grammar. `fill_bitmask` writes the tokens allowed next;
    `accept` advances by the sampled token; `is_finished` once the grammar admits no more
    tokens (the request then stops, without waiting for an end-of-sequence token)."""

    def __init__(self, matcher: llguidance.LLMatcher, compiler: GrammarCompiler) -> None:
        self.matcher, self.compiler = matcher, compiler

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and `is_finished`) if the grammar rejects it."""
        return self.matcher.consume_token(token_id)

    @property
    def is_finished(self) -> bool:
        return self.matcher.is_stopped()

    @property
    def error(self) -> str:
        return self.matcher.get_error()


def _ll_tokenizer(tokenizer_json: str, vocab_size: int, eos_ids: list[int]):
    """llguidance 1.9 takes every end-of-sequence id; older releases (1.6) take one, and then a
    finished grammar allows the first (the engine stops on any of them all the same)."""
    try:
        return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_ids or None)
    except TypeError:
        if len(eos_ids) < 2:
            raise
        return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_ids[0])


class GrammarCompiler:
    """Builds matchers for one tokenizer. `vocab_size` is the width of the model's logits
    (which may exceed the tokenizer's vocabulary); ids past the tokenizer are never allowed."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: set[int]) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = _ll_tokenizer(tokenizer.to_json(), vocab_size, sorted(eos_token_ids))
        self.executor = llguidance.LLExecutor()
        self._lock = threading.Lock()
        self._is_warm = False

    @property
    def bitmask_words(self) -> int:
        return (self.vocab_size + 31) // 32

    def warm_up(self) -> None:
        """Compute one mask, so that the tokenizer's tables are built before a user waits."""
        with self._lock:
            if self._is_warm:
                return
            matcher = self.matcher(GrammarSpec("json_object"))
            mask = torch.empty((1, self.bitmask_words), dtype=torch.int32)
            self.fill_bitmask([matcher], mask)
            self._is_warm = True

    def matcher(self, spec: GrammarSpec) -> GrammarMatcher:
        """A fresh matcher for `spec`; an invalid grammar or schema is a `UserError`."""
        try:
            grammar = spec.to_llguidance()
        except ValueError as e:
            raise UserError(f"the {_name(spec)} is invalid: {e}") from None
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            message = matcher.get_error().strip().splitlines()[0][:_MAX_ERROR_CHARS]
            raise UserError(f"the {_name(spec)} is not supported: {message}")
        return GrammarMatcher(matcher, self)

    def fill_bitmask(self, matchers: list[GrammarMatcher], bitmask: torch.Tensor) -> None:
        """Row i of `bitmask` (R, words) int32, a contiguous CPU tensor, gets the tokens that
        `matchers[i]` allows next (bit t % 32 of word t // 32); rows computed in parallel."""
        if bitmask.shape != (len(matchers), self.bitmask_words) or bitmask.dtype != torch.int32:
            raise ValueError(f"bitmask must be ({len(matchers)}, {self.bitmask_words}) int32")
        if not bitmask.is_contiguous() or bitmask.device.type != "cpu":
            raise ValueError("bitmask must be a contiguous CPU tensor")
        if not matchers:
            return
        pairs = [(m.matcher, i) for i, m in enumerate(matchers)]
        self.executor.unsafe_compute_mask_ptr(
            pairs, bitmask.data_ptr(), self.bitmask_words * 4, len(matchers)
        )


def _name(spec: GrammarSpec) -> str:
    return {"json_schema": "JSON schema", "lark": "grammar", "regex": "regex"}.get(
        spec.kind, "grammar"
    )
