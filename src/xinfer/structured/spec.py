"""`GrammarSpec`: what a request's output must match (a JSON object, a JSON schema, a Lark
grammar or a regex), as plain data that `SamplingParams` can carry and compare; turned into an
llguidance grammar string by `to_llguidance`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from xinfer.errors import UserError

GrammarKind = Literal["json_object", "json_schema", "lark", "regex"]
_KINDS = ("json_object", "json_schema", "lark", "regex")
# Whitespace the JSON grammar allows between tokens: one optional space (`{"a": 1, "b": 2}`
# or compact), so that a weak model cannot spend its budget on blanks. A schema may ask for
# other whitespace with llguidance's "x-guidance": {"whitespace_pattern": ...}.
JSON_WHITESPACE = r"\x20?"
# llguidance's JSON compile options (also usable as a schema's "x-guidance" key)
JSON_GRAMMAR_OPTIONS = {"whitespace_pattern": JSON_WHITESPACE}
MAX_GRAMMAR_CHARS = 256 * 1024


@dataclass(frozen=True)
class GrammarSpec:
    """`source`: the schema as JSON text (json_schema), a Lark grammar (lark, llguidance's
    dialect: may embed `%json {...}`), a regex (regex), or "" (json_object: any object)."""

    kind: GrammarKind
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise UserError(f"grammar kind must be one of {', '.join(_KINDS)}, got {self.kind!r}.")
        if not isinstance(self.source, str):
            raise UserError("a grammar's source must be a string.")
        if len(self.source) > MAX_GRAMMAR_CHARS:
            raise UserError(f"the grammar is longer than {MAX_GRAMMAR_CHARS} characters.")
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.source)
            except ValueError as e:
                raise UserError(f"the JSON schema is not valid JSON: {e}.") from None
            if not isinstance(schema, (dict, bool)):
                raise UserError("a JSON schema must be an object (or true / false).")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool) -> GrammarSpec:
        return cls("json_schema", json.dumps(schema, ensure_ascii=False, sort_keys=True))

    def to_llguidance(self) -> str:
        """The grammar in llguidance's serialized form (validated when a matcher is built)."""
        import llguidance

        options = JSON_GRAMMAR_OPTIONS
        if self.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema(
                {"type": "object"}, defaults=options
            )
        if self.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(self.source, defaults=options)
        if self.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(self.source)
        return llguidance.LLMatcher.grammar_from_regex(self.source)
