"""Needle in a haystack: a fact (a code made of a number and a word) hidden at a chosen
depth in filler prose, sized to N tokens with the server's tokenizer (binary search on the
number of filler sentences), and a checker that finds the code in an answer."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

FILLER = [
    "The river bends twice before it reaches the old mill at the edge of the valley.",
    "Farmers in the region grow barley, rye and a little flax on the terraced fields.",
    "In spring the market square fills with stalls selling cheese, honey and wool.",
    "A narrow road climbs the hill to a chapel whose bell has not rung for decades.",
    "Most houses are built from grey stone quarried a few miles to the north.",
    "The library keeps a collection of maps drawn by travelling surveyors.",
    "Children walk to the school by the bridge, which was rebuilt after a flood.",
    "On clear nights the observatory opens its dome to visitors from the town.",
    "The bakery on the corner sells rye bread, almond cakes and hot soup in winter.",
    "Fishermen mend their nets on the quay while gulls circle above the harbour.",
    "An old railway line, now a footpath, runs along the shore through pine woods.",
    "The town council meets on the first Monday of every month in the guild hall.",
]
WORDS = ["ORCHID", "TUNDRA", "MARBLE", "FALCON", "COBALT", "SAFFRON", "GLACIER", "LANTERN"]
QUESTION = "\n\nWhat is the secret code mentioned in the text above? Answer with the code only."


@dataclass(frozen=True)
class NeedlePrompt:
    text: str  # the user message: haystack with the fact inside, then the question
    code: str  # e.g. "4817-ORCHID": what the answer must contain
    depth: float  # where the fact sits, as a fraction of the filler sentences
    num_tokens: int  # as counted by the server (chat template included)


def make_code(seed: int) -> str:
    rng = random.Random(seed)
    return f"{rng.randrange(1000, 10000)}-{rng.choice(WORDS)}"


def compose(num_sentences: int, code: str, depth: float) -> str:
    sentences = [FILLER[i % len(FILLER)] for i in range(num_sentences)]
    fact = f"Remember this: the secret code is {code}."
    sentences.insert(round(depth * num_sentences), fact)
    return " ".join(sentences) + QUESTION


def build_needle_prompt(
    num_tokens: int, count_tokens: Callable[[str], int], seed: int = 0
) -> NeedlePrompt:
    """The longest haystack whose prompt is at most `num_tokens` tokens; the depth is
    random (seeded) in [0.1, 0.9]. Calls `count_tokens` about log2(N / 10) + 2 times."""
    if num_tokens < 64:
        raise ValueError(f"--prompt-tokens must be at least 64, got {num_tokens}")
    rng = random.Random(seed)
    depth = round(rng.uniform(0.1, 0.9), 3)
    code = make_code(seed)
    base = count_tokens(compose(0, code, depth))
    per = max(1.0, (count_tokens(compose(len(FILLER), code, depth)) - base) / len(FILLER))
    lo, hi = 0, int((num_tokens - base) / per * 1.5) + len(FILLER)  # lo always fits
    best = base
    while lo < hi:  # invariant: compose(lo) fits; compose(hi + 1) may not
        mid = (lo + hi + 1) // 2
        n = count_tokens(compose(mid, code, depth))
        if n <= num_tokens:
            lo, best = mid, n
        else:
            hi = mid - 1
    return NeedlePrompt(compose(lo, code, depth), code, depth, best)


def _normalize(text: str) -> str:
    return re.sub(r"[^0-9A-Z]", "", text.upper())


def contains_fact(answer: str, code: str) -> bool:
    """Whether `answer` states the code, ignoring case, spaces and punctuation
    ("4817 orchid", "4817-Orchid." both count; "4817" alone does not)."""
    key = _normalize(code)
    return bool(key) and key in _normalize(answer)
