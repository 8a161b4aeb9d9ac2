"""A generation request's state as it moves through the scheduler, and the per-step output
delta that is streamed back to callers."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from xinfer.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    state_slot: int = -1  # recurrent-state slot (hybrid models) while running; -1 = none
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    # Prefix caching: chained hashes of the request's full blocks (as far as computed or
    # looked up), how many of its blocks are in the prefix cache, and how many prompt
    # tokens its first admission found there (OpenAI's usage.cached_tokens).
    block_hashes: list[bytes] = field(default_factory=list)
    num_cached_blocks: int = 0
    num_cached_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: str | int | None = None  # the stop string or token that ended it
    generator: torch.Generator | None = None
    max_len: int = 0  # prompt + output may not exceed this (max_model_len)
    text_state: Any = None  # detokenizer + stop matcher, owned by the engine's OutputProcessor
    grammar: Any = None  # structured.GrammarMatcher when params.grammar is set
    # time.monotonic() stamps: first scheduled, first token sampled, finished.
    scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0

    def metrics(self) -> RequestMetrics:
        """The finished request's timings (vLLM's per-request histograms)."""
        end = self.finished_time or time.monotonic()
        scheduled = self.scheduled_time or end
        first = self.first_token_time or end
        return RequestMetrics(
            e2e_s=end - self.arrival_time,
            queue_s=scheduled - self.arrival_time,
            prefill_s=first - scheduled,
            decode_s=end - first,
            num_prompt_tokens=len(self.prompt_token_ids),
            num_output_tokens=len(self.output_token_ids),
            num_cached_tokens=self.num_cached_tokens,
            num_preemptions=self.num_preemptions,
        )

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def num_pending_tokens(self) -> int:
        """Tokens not yet in the KV cache (the whole prompt at first, then one per step)."""
        return self.num_tokens - self.num_computed_tokens


@dataclass(frozen=True)
class RequestMetrics:
    """Seconds from arrival to finish (`e2e_s`), waiting for a first schedule (`queue_s`),
    from then to the first token (`prefill_s`), and from there to the last (`decode_s`)."""

    e2e_s: float
    queue_s: float
    prefill_s: float
    decode_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    num_preemptions: int

    @property
    def inference_s(self) -> float:
        return self.prefill_s + self.decode_s


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class RequestOutput:
    """What one step produced for one request (a delta; `LLM` accumulates them)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    metrics: RequestMetrics | None = None  # on the finishing delta only
