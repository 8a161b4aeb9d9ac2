"""Grammar rows on the GPU, beside rows without one, in CUDA-graph decode with decode
look-ahead: JSON answers parse and validate; every row's text is the same with look-ahead on
and off; the plain rows' text is the same as without grammar rows in the batch (greedy and a
seeded sampled row alike). Needs llguidance on the GPU machine (an abi3 wheel, no deps)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from xinfer.config import EngineConfig
from xinfer.engine.engine import Engine
from xinfer.llm import demo_model_path
from xinfer.sampling import SamplingParams
from xinfer.structured import GrammarSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "role"],
    "additionalProperties": False,
}
PLAIN = [
    ("Hello", SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)),
    ("Explain list comprehensions", SamplingParams(max_tokens=48, temperature=0.8, seed=3)),
]
GRAMMAR = [
    ("Describe a user as JSON.", GrammarSpec.json_schema(SCHEMA)),
    ("Hello", GrammarSpec("json_object")),
]


def _run(look_ahead: bool, with_grammar: bool) -> tuple[list[str], dict]:
    config = EngineConfig(model=demo_model_path(), device="cuda:0", decode_look_ahead=look_ahead)
    engine = Engine(config, show_progress=False)
    assert engine.runner.graph_runner is not None and engine.runner.graph_runner.graphs
    tok = engine.tokenizer
    jobs = list(PLAIN)
    if with_grammar:
        jobs += [(p, SamplingParams(max_tokens=80, temperature=0, grammar=g)) for p, g in GRAMMAR]
    texts = {}
    for prompt, params in jobs:
        ids = tok.encode_chat([{"role": "user", "content": prompt}])
        texts[engine.add_request(ids, params)] = ""
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] += out.new_text
    return list(texts.values()), dict(engine.runner.look_ahead_counts)


@pytest.mark.gpu
def test_grammar_rows_in_graphed_decode_with_look_ahead():
    on, counts = _run(look_ahead=True, with_grammar=True)
    assert counts["used"] > 0
    off, _ = _run(look_ahead=False, with_grammar=True)
    assert on == off
    jsonschema.validate(json.loads(on[2]), SCHEMA)
    assert isinstance(json.loads(on[3]), dict)
    alone, _ = _run(look_ahead=True, with_grammar=False)
    assert on[:2] == alone
