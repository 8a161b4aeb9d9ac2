"""Tests for xinfer.sampling: parameter validation, the logit masks against independent
per-row loops, penalties against hand computations, and the seeded/unseeded draws."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from xinfer.errors import UserError
from xinfer.sampling import (
    SamplingMetadata,
    SamplingParams,
    apply_min_p,
    apply_penalties,
    apply_top_k,
    apply_top_p,
    make_generator,
    sample,
)

CPU = torch.device("cpu")


def build(params, vocab_size, prompt_ids=None, output_ids=None, generators=None, **kw):
    n = len(params)
    return SamplingMetadata.build(
        params,
        prompt_ids or [[] for _ in range(n)],
        output_ids or [[] for _ in range(n)],
        generators or [None] * n,
        vocab_size,
        CPU,
        **kw,
    )


BAD_PARAMS = [
    {"max_tokens": 0},
    {"temperature": -0.1},
    {"temperature": float("nan")},
    {"top_p": 0.0},
    {"top_p": 1.01},
    {"top_k": -2},
    {"top_k": 2.5},
    {"min_p": -0.01},
    {"min_p": 1.5},
    {"repetition_penalty": 0.0},
    {"repetition_penalty": -1.0},
    {"presence_penalty": 2.5},
    {"presence_penalty": -2.01},
    {"frequency_penalty": 3.0},
    {"frequency_penalty": -3.0},
    {"n": 0},
    {"logprobs": -1},
    {"logprobs": 21},
    {"min_tokens": -1},
    {"min_tokens": 5, "max_tokens": 4},
    {"seed": "42"},
    {"stop": ["ok", ""]},
    {"stop_token_ids": [-3]},
    {"temperature": "hot"},
    # each of these was accepted: a TypeError later, a dict taken as its keys, "no" as true,
    # or a value the float32 sampler turns into inf / 0 (nan probabilities: token 0 drawn)
    {"stop": 5},
    {"stop": {"a": 1}},
    {"stop_token_ids": 12},
    {"ignore_eos": "no"},
    {"skip_special_tokens": "no"},
    {"skip_special_tokens": 0},
    {"temperature": float("inf")},
    {"temperature": 1e39},
    {"repetition_penalty": float("inf")},
    {"repetition_penalty": 1e39},
    {"repetition_penalty": 1e-300},
]


@pytest.mark.parametrize("kwargs", BAD_PARAMS, ids=[str(k) for k in BAD_PARAMS])
def test_bad_params_raise_user_error(kwargs):
    with pytest.raises(UserError):
        SamplingParams(**kwargs)


def test_params_defaults_and_normalisation():
    params = SamplingParams(stop="END", top_k=-1, logprobs=20, temperature=0)
    assert params.stop == ["END"] and params.stop_token_ids == []
    assert params.is_greedy and not SamplingParams().is_greedy
    copy = dataclasses.replace(params, stop=["a", "b"], max_tokens=3)
    assert copy.stop == ["a", "b"] and copy.max_tokens == 3
    with pytest.raises(UserError):
        dataclasses.replace(params, top_p=2.0)


def test_top_k_hand_made():
    logits = torch.tensor([[1.0, 3.0, 2.0, 5.0], [0.5, -1.0, 4.0, 2.0]])
    out = apply_top_k(logits, torch.tensor([2, 4]), 4)
    assert torch.isinf(out[0]).tolist() == [True, False, True, False]
    assert torch.equal(out[1], logits[1])  # k = V keeps everything


def test_top_k_matches_loop():
    logits = torch.randn(7, 53)
    k = torch.randint(1, 60, (7,))
    out = apply_top_k(logits, k, int(k.max()))
    for row in range(7):
        keep = set(logits[row].topk(min(int(k[row]), 53)).indices.tolist())
        expected = [i in keep for i in range(53)]
        assert (~torch.isinf(out[row])).tolist() == expected
        assert torch.equal(out[row][~torch.isinf(out[row])], logits[row][expected])


def reference_top_p(row: torch.Tensor, p: float) -> list[bool]:
    probs = row.double().softmax(-1).tolist()
    keep, mass = [False] * len(probs), 0.0
    for i in sorted(range(len(probs)), key=lambda i: -probs[i]):
        if mass >= p:
            break
        keep[i], mass = True, mass + probs[i]
    return keep


def test_top_p_hand_made():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert (~torch.isinf(apply_top_p(logits, torch.tensor([0.7])))).tolist() == [
        [True, True, False, False]
    ]
    assert (~torch.isinf(apply_top_p(logits, torch.tensor([0.85])))).tolist() == [
        [True, True, True, False]
    ]
    assert (~torch.isinf(apply_top_p(logits, torch.tensor([0.2])))).tolist() == [
        [True, False, False, False]
    ]


def test_top_p_matches_loop():
    logits = torch.randn(9, 41) * 2
    p = torch.rand(9) * 0.98 + 0.01
    p[0] = 1.0
    out = apply_top_p(logits, p)
    for row in range(9):
        assert (~torch.isinf(out[row])).tolist() == reference_top_p(logits[row], float(p[row]))
    assert not torch.isinf(out[0]).any()


def test_min_p_matches_loop():
    logits = torch.randn(6, 37) * 3
    min_p = torch.rand(6)
    out = apply_min_p(logits, min_p)
    for row in range(6):
        probs = logits[row].softmax(-1).tolist()
        top = max(probs)
        expected = [q >= float(min_p[row]) * top for q in probs]
        assert (~torch.isinf(out[row])).tolist() == expected


def test_penalties_hand_computed():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    seen = torch.tensor([[True, True, False, True, False]])  # prompt has 0, 1; output has 3 twice
    counts = torch.tensor([[0.0, 0.0, 0.0, 2.0, 0.0]])
    out = apply_penalties(
        logits, seen, counts, torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([0.25])
    )
    expected = [2.0 / 2, -1.0 * 2, 0.5, 3.0 / 2 - 0.25 * 2 - 0.5, -2.0]
    assert out[0].tolist() == pytest.approx(expected)


def test_penalties_through_build_match_hand_computation():
    vocab = 6
    logits = torch.randn(2, vocab) * 3
    params = [
        SamplingParams(temperature=0, repetition_penalty=1.3, frequency_penalty=0.7),
        SamplingParams(temperature=0, presence_penalty=-0.4),
    ]
    prompts, outputs = [[0, 5, 5], [1]], [[2, 2, 3], [4, 4, 4]]
    meta = build(params, vocab, prompts, outputs)
    pen = meta.penalties
    got = apply_penalties(
        logits, pen.seen, pen.output_counts, pen.repetition, pen.presence, pen.frequency
    )
    expected = logits.clone()
    for row, p in enumerate(params):
        for tok in set(prompts[row]) | set(outputs[row]):
            x = expected[row, tok]
            rp = p.repetition_penalty
            expected[row, tok] = x / rp if x > 0 else x * rp
        for tok in set(outputs[row]):
            count = outputs[row].count(tok)
            expected[row, tok] -= p.frequency_penalty * count + p.presence_penalty
    torch.testing.assert_close(got, expected)
    assert sample(logits, meta).token_ids == expected.argmax(-1).tolist()


def test_common_case_builds_no_extra_tensors():
    meta = build([SamplingParams(temperature=0)] * 3, 100)
    assert meta.is_all_greedy
    assert meta.penalties is None and meta.top_k is None and meta.top_p is None
    assert meta.min_p is None and meta.banned is None


def test_greedy_is_argmax_even_in_mixed_batch():
    logits = torch.randn(8, 300)
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, top_k=5) for i in range(8)]
    ids = sample(logits, build(params, 300)).token_ids
    argmax = logits.argmax(-1).tolist()
    assert [ids[i] for i in range(1, 8, 2)] == [argmax[i] for i in range(1, 8, 2)]
    # Sampled rows stay within their top-5.
    for i in range(0, 8, 2):
        assert ids[i] in logits[i].topk(5).indices.tolist()


def run_seeded(logits_rows, seeds, steps=5, extra_params=None):
    """Sample `steps` times; row i uses seed seeds[i] (None = unseeded)."""
    vocab = logits_rows.shape[-1]
    params = [SamplingParams(seed=s, top_p=0.9, **(extra_params or {})) for s in seeds]
    gens = [make_generator(s, CPU) if s is not None else None for s in seeds]
    out = []
    for _ in range(steps):
        out.append(sample(logits_rows, build(params, vocab, generators=gens)).token_ids)
    return [[step[i] for step in out] for i in range(len(seeds))]


def test_seeded_sampling_is_reproducible_across_runs_and_batches():
    vocab = 500
    target = torch.randn(1, vocab)
    others = torch.randn(3, vocab)
    alone = run_seeded(target, [1234])[0]
    assert run_seeded(target, [1234])[0] == alone
    mixed = torch.cat([others[:2], target, others[2:]])
    assert run_seeded(mixed, [None, 7, 1234, None])[2] == alone
    assert run_seeded(torch.cat([target, others]), [1234, 5, 6, 7])[0] == alone


def test_different_seeds_differ():
    flat = torch.zeros(2, 1000)
    tokens = run_seeded(flat, [1, 2], steps=10)
    assert tokens[0] != tokens[1]
    assert len(set(tokens[0])) > 1  # the generator advances between steps


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 0), (1.5, 3)])
def test_frequencies_follow_softmax(temperature, top_k):
    num_draws, vocab = 20000, 5
    logits = torch.randn(vocab)
    expected = logits / temperature
    if top_k:
        expected = expected.masked_fill(expected < expected.topk(top_k).values[-1], -math.inf)
    expected = expected.softmax(-1)
    params = [SamplingParams(temperature=temperature, top_k=top_k)] * num_draws
    ids = sample(logits.expand(num_draws, vocab), build(params, vocab)).token_ids
    freq = torch.bincount(torch.tensor(ids), minlength=vocab).double() / num_draws
    # The standard error is at most 0.0036; 0.02 is more than five of them.
    assert (freq - expected.double()).abs().max() < 0.02
    if top_k:
        assert freq[expected == 0].sum() == 0


def test_seeded_draws_follow_softmax():
    vocab, steps = 4, 3000
    logits = torch.randn(1, vocab)
    params = [SamplingParams(seed=99)]
    gen = make_generator(99, CPU)
    ids = [
        sample(logits, build(params, vocab, generators=[gen])).token_ids[0] for _ in range(steps)
    ]
    freq = torch.bincount(torch.tensor(ids), minlength=vocab).double() / steps
    assert (freq - logits[0].double().softmax(-1)).abs().max() < 0.05


def test_logprobs_come_from_raw_logits():
    vocab = 64
    logits = torch.randn(4, vocab) * 2
    params = [
        SamplingParams(logprobs=5, temperature=0.5, repetition_penalty=1.5, top_k=10),
        SamplingParams(),
        SamplingParams(logprobs=0, temperature=0),
        SamplingParams(logprobs=20, presence_penalty=1.0),
    ]
    meta = build(params, vocab, [[1, 2, 3]] * 4, [[4, 4], [5], [], [6]])
    result = sample(logits, meta)
    raw_lp = logits.log_softmax(-1)
    assert result.logprobs[1] is None
    for row, k in [(0, 5), (2, 0), (3, 20)]:
        entry = result.logprobs[row]
        assert entry.token_id == result.token_ids[row]
        assert entry.logprob == pytest.approx(raw_lp[row, entry.token_id].item(), abs=1e-5)
        top = raw_lp[row].topk(k) if k else None
        assert entry.top_ids == (top.indices.tolist() if k else [])
        assert entry.top_logprobs == pytest.approx(top.values.tolist() if k else [], abs=1e-5)


def test_min_tokens_bans_eos_and_stop_ids():
    vocab = 10
    logits = torch.zeros(3, vocab)
    logits[:, 7] = 50.0  # eos would win
    logits[:, 3] = 40.0  # stop_token_id would come next
    params = [
        SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[3]),
        SamplingParams(temperature=0, min_tokens=2),
        SamplingParams(temperature=0, min_tokens=2, ignore_eos=True),
    ]
    outputs = [[1], [1, 2], []]
    ids = sample(logits, build(params, vocab, output_ids=outputs, eos_token_ids={7})).token_ids
    assert ids[0] not in (3, 7) and ids[1] == 7 and ids[2] == 7
    # ignore_eos: the eos id is an ordinary token there (the engine does not stop on it).


def test_extreme_allowed_values_never_draw_a_banned_token():
    """The widest temperature and repetition penalty SamplingParams accepts keep the float32
    sampler finite: a banned token (-inf) is never drawn. Beyond float32 (temperature 1e308
    was accepted) the banned logits became nan and the draw fell on token 0."""
    vocab = 10
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0)) * 30
    logits[:, 0] = 60.0  # token 0 (banned below) would win
    params = [
        SamplingParams(temperature=1e6, min_tokens=1, seed=1),
        SamplingParams(temperature=1.0, repetition_penalty=1e-6, min_tokens=1, seed=2),
        SamplingParams(temperature=1e-5, repetition_penalty=1e6, min_tokens=1, seed=3),
        SamplingParams(temperature=1e6, repetition_penalty=1e6, min_tokens=1, seed=4),
    ]
    for _ in range(20):
        meta = build(params, vocab, prompt_ids=[[1, 2, 0]] * 4, eos_token_ids={0})
        assert 0 not in sample(logits, meta).token_ids


def test_for_params_equals_build_without_history_and_refuses_penalties():
    """A queued look-ahead step's metadata (`for_params`) samples exactly as `build` does for
    rows without penalties past `min_tokens`; rows with a penalty need `build`."""
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, seed=3),
        SamplingParams(temperature=1.3, min_tokens=2, logprobs=2),
    ]
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    outputs = [[1, 2], [3, 4], [5, 6]]  # every row past its min_tokens: nothing banned
    drawn = []
    for meta_of in (
        lambda g: build(params, 40, output_ids=outputs, generators=g, eos_token_ids={0}),
        lambda g: SamplingMetadata.for_params(params, g, 40, CPU),
    ):
        torch.manual_seed(5)
        gens = [None, make_generator(3, CPU), None]
        r = sample(logits, meta_of(gens))
        drawn.append((r.token_ids, [None if lp is None else lp.top_ids for lp in r.logprobs]))
    assert drawn[0] == drawn[1]
    with pytest.raises(ValueError, match="penalties"):
        SamplingMetadata.for_params([SamplingParams(presence_penalty=0.5)], [None], 40, CPU)
