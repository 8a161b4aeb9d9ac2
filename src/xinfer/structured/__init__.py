"""Grammar-guided decoding: a request's `GrammarSpec` (JSON object, JSON schema, Lark, regex)
is compiled by llguidance into a per-request `GrammarMatcher`; each step the runner turns the
matchers of the grammar rows into a token bitmask that the sampler applies to the logits."""

from xinfer.structured.bitmask import apply_token_bitmask, grammar_bitmask
from xinfer.structured.compiler import GrammarCompiler, GrammarMatcher
from xinfer.structured.spec import GrammarSpec

__all__ = [
    "GrammarCompiler",
    "GrammarMatcher",
    "GrammarSpec",
    "apply_token_bitmask",
    "grammar_bitmask",
]
