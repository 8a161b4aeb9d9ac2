"""Token sampling: per-request `SamplingParams`, the per-step batch view `SamplingMetadata`,
and `sample`, which turns (B, V) logits into one token per row (penalties → greedy →
temperature → top-k → top-p → min-p → draw) plus optional logprobs of the raw logits. Rows
with a grammar (structured output) first lose the tokens their grammar forbids."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from xinfer.errors import UserError
from xinfer.structured.bitmask import apply_token_bitmask
from xinfer.structured.spec import GrammarSpec

MAX_LOGPROBS = 20
SEED_RANGE = (-(2**63), 2**63 - 1)  # a seed must fit a signed 64-bit integer
# Temperatures below this are sampled greedily: dividing logits by them overflows float32.
_GREEDY_EPS = 1e-5
_INT_FIELDS = ("max_tokens", "top_k", "min_tokens", "n")
# The widest temperature and repetition penalty: the sampler divides (and multiplies) float32
# logits by them, and beyond float32's range they become inf or 0 there (nan probabilities,
# a garbage draw); 1e6 is far past any useful value and keeps every step finite.
_MAX_FACTOR = 1e6
# field: (lowest, highest, whether `lowest` itself is excluded)
_BOUNDS = {
    "max_tokens": (1, math.inf, False),
    "temperature": (0, _MAX_FACTOR, False),
    "top_p": (0, 1, True),
    "top_k": (-1, math.inf, False),  # -1 and 0 mean off
    "min_p": (0, 1, False),
    "repetition_penalty": (1 / _MAX_FACTOR, _MAX_FACTOR, False),
    "presence_penalty": (-2, 2, False),
    "frequency_penalty": (-2, 2, False),
    "min_tokens": (0, math.inf, False),
    "n": (1, math.inf, False),
}


@dataclass
class SamplingParams:
    """How to pick the tokens of one request (OpenAI / vLLM names and semantics)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # HF: logits of prompt+output tokens / p if > 0 else * p
    presence_penalty: float = 0.0  # OpenAI: over output tokens only
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None  # always a list after __post_init__
    stop_token_ids: list[int] | None = None  # always a list after __post_init__
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # k: the sampled token's logprob plus the top-k alternatives
    n: int = 1
    skip_special_tokens: bool = True
    grammar: GrammarSpec | None = None  # the output must match it (structured output)

    def __post_init__(self) -> None:
        self.stop = _listed(self.stop, _STOP_SHAPE, str)
        self.stop_token_ids = _listed(self.stop_token_ids, _STOP_IDS_SHAPE)
        for name, (low, high, is_low_open) in _BOUNDS.items():
            value = getattr(self, name)
            kind = int if name in _INT_FIELDS else (int, float)
            if isinstance(value, bool) or not isinstance(value, kind) or math.isnan(value):
                raise UserError(f"{name} must be a number, got {value!r}.")
            if value < low or (is_low_open and value == low) or value > high:
                low_text = f"{'>' if is_low_open else '>='} {low:g}"
                bounds = low_text if high == math.inf else f"{low_text} and <= {high:g}"
                raise UserError(f"{name} must be {bounds}, got {value!r}.")
        for name in ("ignore_eos", "skip_special_tokens"):
            if type(getattr(self, name)) is not bool:
                raise UserError(f"{name} must be true or false, got {getattr(self, name)!r}.")
        if self.min_tokens > self.max_tokens:
            raise UserError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens.")
        if self.logprobs is not None and (
            type(self.logprobs) is not int or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise UserError(f"logprobs must be null or an integer in [0, {MAX_LOGPROBS}].")
        if self.seed is not None and type(self.seed) is not int:
            raise UserError(f"seed must be null or an integer, got {self.seed!r}.")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise UserError(
                f"seed must be between {SEED_RANGE[0]} and {SEED_RANGE[1]} (64 bits), "
                f"got {self.seed}."
            )
        if self.grammar is not None and not isinstance(self.grammar, GrammarSpec):
            raise UserError("grammar must be a GrammarSpec (xinfer.structured).")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise UserError(_STOP_SHAPE)
        if not all(type(t) is int and t >= 0 for t in self.stop_token_ids):
            raise UserError(_STOP_IDS_SHAPE)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


_STOP_SHAPE = "stop must be a non-empty string or a list of them."
_STOP_IDS_SHAPE = "stop_token_ids must be a list of non-negative integers."


def _listed(value, shape: str, single: type | tuple[type, ...] = ()) -> list:
    """None → [], a `single` value → [value], a list or tuple → a list, else `shape`."""
    if value is None:
        return []
    if isinstance(value, single):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise UserError(shape)


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """The per-request RNG of a seeded request; it only ever draws that request's rows."""
    return torch.Generator(device=device).manual_seed(seed)


@dataclass(frozen=True)
class Penalties:
    """Per-row penalty inputs; built only when some row of the batch uses a penalty."""

    seen: torch.Tensor  # (B, V) bool: token occurs in prompt or output
    output_counts: torch.Tensor  # (B, V) float32: occurrences in the output
    repetition: torch.Tensor  # (B,) float32
    presence: torch.Tensor  # (B,) float32
    frequency: torch.Tensor  # (B,) float32


@dataclass(frozen=True)
class SamplingMetadata:
    """The sampling settings of one engine step's B rows as tensors; `None` = unused by all."""

    temperature: torch.Tensor | None  # (B,) float32, 1.0 on greedy rows; None: all greedy
    greedy: torch.Tensor | None  # (B,) bool; None when no row or every row is greedy
    is_all_greedy: bool
    top_k: torch.Tensor | None  # (B,) int64, V where off
    top_p: torch.Tensor | None  # (B,) float32
    min_p: torch.Tensor | None  # (B,) float32
    penalties: Penalties | None
    banned: tuple[torch.Tensor, torch.Tensor] | None  # (row_ids, token_ids) forced to -inf
    generators: list[torch.Generator | None]
    num_logprobs: list[int | None]
    # (row_ids (R,), bitmask (R, ceil(V / 32)) int32): the tokens each grammar row may take
    allowed: tuple[torch.Tensor, torch.Tensor] | None = None
    # Host-side max of `top_k` (the width of the top-k pass), so sampling never reads it back.
    max_top_k: int = 0

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        prompt_ids: list[list[int]],
        output_ids: list[list[int]],
        generators: list[torch.Generator | None],
        vocab_size: int,
        device: torch.device | str,
        eos_token_ids: set[int] | None = None,
        allowed: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> SamplingMetadata:
        """`eos_token_ids`, when given, are banned (with `stop_token_ids`) on rows that have
        not yet produced `min_tokens` tokens (unless the row sets `ignore_eos`); `allowed` is
        the grammar rows' token bitmask (`structured.grammar_bitmask`)."""
        if not len(prompt_ids) == len(output_ids) == len(generators) == len(params):
            raise ValueError("params, prompt_ids, output_ids and generators differ in length")

        column = functools.partial(_column, device=device)
        floats = lambda name: column([getattr(p, name) for p in params])
        penalties = None  # the common case (no penalties) skips the (B, V) tensors
        if uses_penalties(params):
            output_counts = _token_counts(output_ids, vocab_size, device)
            seen = output_counts > 0
            if any(p.repetition_penalty != 1 for p in params):
                seen |= _token_counts(prompt_ids, vocab_size, device) > 0
            penalties = Penalties(
                seen,
                output_counts,
                *map(floats, ("repetition_penalty", "presence_penalty", "frequency_penalty")),
            )
        banned_rows, banned_ids = [], []
        for row, p in enumerate(params):
            if len(output_ids[row]) < p.min_tokens:
                stops = set(p.stop_token_ids) | (set() if p.ignore_eos else eos_token_ids or set())
                ids = [t for t in sorted(stops) if t < vocab_size]
                banned_rows, banned_ids = banned_rows + [row] * len(ids), banned_ids + ids
        banned = (
            (column(banned_rows, torch.int64), column(banned_ids, torch.int64))
            if banned_ids
            else None
        )
        return cls.for_params(
            params,
            generators,
            vocab_size,
            device,
            penalties=penalties,
            banned=banned,
            allowed=allowed,
        )

    @classmethod
    def for_params(
        cls,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        vocab_size: int,
        device: torch.device | str,
        *,
        penalties: Penalties | None = None,
        banned: tuple[torch.Tensor, torch.Tensor] | None = None,
        allowed: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> SamplingMetadata:
        """The per-row settings that follow from `params` alone. Called directly (without
        `penalties` / `banned`, which need the token history) only for rows that use no
        penalty and are past their `min_tokens`, as a queued look-ahead step's are."""
        if penalties is None and uses_penalties(params):
            raise ValueError("penalties need the token history; use SamplingMetadata.build")
        column = functools.partial(_column, device=device)
        floats = lambda name: column([getattr(p, name) for p in params])
        is_greedy = [p.temperature < _GREEDY_EPS for p in params]
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        return cls(
            temperature=None
            if all(is_greedy)
            else column([1.0 if is_greedy[i] else p.temperature for i, p in enumerate(params)]),
            greedy=column(is_greedy, torch.bool) if 0 < sum(is_greedy) < len(params) else None,
            is_all_greedy=all(is_greedy),
            top_k=column(top_k, torch.int64) if min(top_k, default=0) < vocab_size else None,
            top_p=floats("top_p") if any(p.top_p < 1 for p in params) else None,
            min_p=floats("min_p") if any(p.min_p > 0 for p in params) else None,
            penalties=penalties,
            banned=banned,
            generators=list(generators),
            num_logprobs=[p.logprobs for p in params],
            allowed=allowed,
            max_top_k=max(top_k, default=0),
        )

    @classmethod
    def for_greedy(cls, num_logprobs: list[int | None]) -> SamplingMetadata:
        """Rows that are all greedy, with no penalty and no banned token."""
        return cls(None, None, True, None, None, None, None, None, [None] * len(num_logprobs),
                   list(num_logprobs))  # fmt: skip


def _column(values: list, dtype: torch.dtype = torch.float32, *, device) -> torch.Tensor:
    """A host list on `device` without waiting for the GPU: `torch.tensor(..., device=cuda)`
    synchronizes the stream, which would drain a queued (look-ahead) step every step."""
    pinned = torch.device(device).type == "cuda"  # the caching host allocator keeps it alive
    return torch.tensor(values, dtype=dtype, pin_memory=pinned).to(device, non_blocking=True)


def uses_penalties(params: list[SamplingParams]) -> bool:
    """Some row applies a repetition, presence or frequency penalty."""
    return any(
        p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty for p in params
    )


def _token_counts(
    rows: list[list[int]], vocab_size: int, device: torch.device | str
) -> torch.Tensor:
    """(B, V) float32 counts of each token id per row."""
    max_len = max((len(r) for r in rows), default=0)
    # Pad with an extra id `vocab_size` whose column is dropped afterwards.
    padded = torch.tensor([r + [vocab_size] * (max_len - len(r)) for r in rows], dtype=torch.int64)
    padded = padded.reshape(len(rows), max_len).to(device, non_blocking=True)
    counts = torch.zeros(len(rows), vocab_size + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,
    seen: torch.Tensor,
    output_counts: torch.Tensor,
    repetition: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
) -> torch.Tensor:
    """HF repetition penalty on `seen` tokens, then OpenAI presence/frequency on output counts."""
    rep = repetition[:, None]
    logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    return logits - frequency[:, None] * output_counts - presence[:, None] * (output_counts > 0)


def apply_top_k(logits: torch.Tensor, k: torch.Tensor, max_k: int) -> torch.Tensor:
    """Keep each row's k largest logits (k: (B,) int64, >= V means off); ties with the k-th stay.
    `max_k` is the host-side bound of k (`SamplingMetadata.max_top_k`): reading `k.max()` back
    from the device would stall the decode loop every step."""
    max_k = min(max(1, max_k), logits.shape[-1])
    top = logits.topk(max_k, dim=-1).values  # (B, max_k), descending
    kth = top.gather(1, (k.clamp(1, max_k) - 1)[:, None])  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches p (p: (B,) in (0, 1])."""
    sorted_logits, order = logits.sort(dim=-1)  # ascending
    tail_mass = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # mass of this token and all below
    remove = tail_mass <= 1 - p[:, None]
    remove[:, -1] = False  # the most likely token always stays
    remove = torch.empty_like(remove).scatter_(1, order, remove)  # back to vocab order
    return logits.masked_fill(remove, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the row's top probability."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    return logits.masked_fill(probs < threshold, float("-inf"))


def random_sample(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """Exponential race: argmax(p / E), E ~ Exp(1), draws token i with probability p_i.
    Seeded rows draw E from their own generator, so batch composition does not matter."""
    race = torch.empty_like(probs)
    seeded = [row for row, gen in enumerate(generators) if gen is not None]
    if len(seeded) < len(generators):
        race.exponential_()
    for row in seeded:
        race[row].exponential_(generator=generators[row])
    return probs.div(race).argmax(dim=-1)


@dataclass(frozen=True)
class TokenLogprobs:
    """The sampled token's logprob and the top-N alternatives, from the raw logits."""

    token_id: int
    logprob: float
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass(frozen=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


class PendingSample:
    """A step's sampled tokens (and logprobs) still on the device: every tensor is copied to
    the host without blocking, and `result()` waits for those copies alone, so the caller
    can queue more GPU work (the next step) before it reads this one."""

    def __init__(
        self, token_ids: torch.Tensor, logprobs: _LogprobTensors | None, num_logprobs: list
    ) -> None:
        self.token_ids_device = token_ids
        self.num_logprobs = num_logprobs
        tensors = [token_ids] + ([] if logprobs is None else list(logprobs))
        self.event = None
        if token_ids.is_cuda:
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
            for dst, src in zip(host, tensors):
                dst.copy_(src, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
            tensors = host
        self._host = tensors

    def result(self) -> SampleResult:
        if self.event is not None:
            self.event.synchronize()
        token_ids = self._host[0].tolist()
        result: list[TokenLogprobs | None] = [None] * len(self.num_logprobs)
        if len(self._host) > 1:
            rows, chosen, top_lp, top_ids = (t.tolist() for t in self._host[1:])
            for i, row in enumerate(rows):
                k = self.num_logprobs[row]
                result[row] = TokenLogprobs(
                    token_ids[row], chosen[i], top_ids[i][:k], top_lp[i][:k]
                )
        return SampleResult(token_ids, result)


class RngSnapshot:
    """The states of every generator that sampling `meta` on `device` will draw from (each
    seeded row's own; the device's default one when some row is unseeded), taken before the
    draw, so that a sampled step whose result is thrown away can be undone: `restore()` puts
    the streams back as if it had never run."""

    def __init__(self, meta: SamplingMetadata, device: torch.device | str) -> None:
        gens: list[torch.Generator] = []
        if not meta.is_all_greedy:
            gens = [g for g in meta.generators if g is not None]
            if len(gens) < len(meta.generators):
                gens.append(_default_generator(torch.device(device)))
        self._states = [(g, g.get_state()) for g in gens]

    def restore(self) -> None:
        for gen, state in self._states:
            gen.set_state(state)


def _default_generator(device: torch.device) -> torch.Generator:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


def sample(logits: torch.Tensor, meta: SamplingMetadata) -> SampleResult:
    """Pick one token per row of `logits` (B, V) as `meta` says; `logits` is not modified."""
    return sample_async(logits, meta).result()


def sample_async(logits: torch.Tensor, meta: SamplingMetadata) -> PendingSample:
    """`sample` without waiting: the tokens stay on the device until `result()`."""
    raw, logits = logits, logits.float()
    if meta.penalties is not None:
        pen = meta.penalties
        logits = apply_penalties(
            logits, pen.seen, pen.output_counts, pen.repetition, pen.presence, pen.frequency
        )
    if meta.banned is not None:
        logits = logits.index_put(meta.banned, logits.new_full((), float("-inf")))
    if meta.allowed is not None:  # grammar rows: only the tokens their grammar allows
        logits = apply_token_bitmask(logits, *meta.allowed)
    if meta.is_all_greedy:
        token_ids = logits.argmax(dim=-1)
    else:
        greedy_ids = logits.argmax(dim=-1) if meta.greedy is not None else None
        logits = logits / meta.temperature[:, None]
        if meta.top_k is not None:
            logits = apply_top_k(logits, meta.top_k, meta.max_top_k)
        if meta.top_p is not None:
            logits = apply_top_p(logits, meta.top_p)
        if meta.min_p is not None:
            logits = apply_min_p(logits, meta.min_p)
        token_ids = random_sample(logits.softmax(dim=-1), meta.generators)
        if greedy_ids is not None:
            token_ids = torch.where(meta.greedy, greedy_ids, token_ids)
    return PendingSample(token_ids, _logprobs(raw, token_ids, meta.num_logprobs), meta.num_logprobs)


# (rows, chosen logprob per row, top logprobs (R, max_k), top ids (R, max_k))
_LogprobTensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _logprobs(
    raw: torch.Tensor, token_ids: torch.Tensor, num_logprobs: list[int | None]
) -> _LogprobTensors | None:
    """Logprobs of the raw logits for the rows that asked, as device tensors."""
    rows = [row for row, k in enumerate(num_logprobs) if k is not None]
    if not rows:
        return None
    row_ids = _column(rows, torch.int64, device=raw.device)
    logprobs = raw[row_ids].float().log_softmax(dim=-1)  # (R, V)
    chosen = logprobs.gather(1, token_ids[row_ids][:, None]).squeeze(1)
    max_k = max(num_logprobs[row] for row in rows)
    top_lp, top_ids = logprobs.topk(max_k, dim=-1)  # (R, max_k)
    return row_ids, chosen, top_lp, top_ids
