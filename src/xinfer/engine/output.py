"""Turns sampled tokens into output deltas: incremental detokenization, stop strings, stop
tokens, EOS, a completed grammar and length limits decide when a request finishes and what
text it shows."""

from __future__ import annotations

from dataclasses import dataclass

from xinfer.engine.request import Request, RequestOutput
from xinfer.tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer


@dataclass
class _TextState:
    detok: IncrementalDetokenizer
    stops: StopStringMatcher | None


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None, eos_ids: set[int]) -> None:
        self.tokenizer, self.eos_ids = tokenizer, eos_ids

    def register(self, req: Request) -> None:
        if self.tokenizer is None:
            return
        detok = IncrementalDetokenizer(
            self.tokenizer, req.prompt_token_ids, req.params.skip_special_tokens
        )
        stops = StopStringMatcher(req.params.stop) if req.params.stop else None
        req.text_state = _TextState(detok, stops)

    def append(self, req: Request, token: int, logprob) -> RequestOutput:
        req.output_token_ids.append(token)
        p = req.params
        reason, stop_reason = None, None
        if token in self.eos_ids and not p.ignore_eos:
            reason = "stop"
        elif p.stop_token_ids and token in p.stop_token_ids:
            reason, stop_reason = "stop", token
        text = ""
        st: _TextState | None = req.text_state
        if st is not None and reason is None:
            text = st.detok.add(token)
            if st.stops is not None:
                text, hit = st.stops.feed(text)
                if hit:
                    reason, stop_reason = "stop", st.stops.matched
        if reason is None and req.grammar is not None:
            # The mask admits only what the grammar accepts; once it admits nothing more (the
            # JSON value is closed) the output is complete, with no end-of-sequence token.
            if not req.grammar.accept(token) or req.grammar.is_finished:
                reason = "stop"
        if reason is None and (
            len(req.output_token_ids) >= p.max_tokens or req.num_tokens >= req.max_len
        ):
            reason = "length"
        if reason is not None and st is not None and st.stops is not None and stop_reason is None:
            text += st.stops.flush()
        req.finish_reason = reason
        req.stop_reason = stop_reason
        return RequestOutput(
            request_id=req.request_id,
            new_token_ids=[token],
            new_text=text,
            finished=reason is not None,
            finish_reason=reason,
            stop_reason=stop_reason,
            new_logprobs=[logprob] if logprob is not None else [],
            num_prompt_tokens=len(req.prompt_token_ids),
            num_output_tokens=len(req.output_token_ids),
            num_cached_tokens=req.num_cached_tokens,
        )
