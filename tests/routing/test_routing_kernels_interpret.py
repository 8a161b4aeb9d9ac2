"""The routing-model kernels (`kernels/triton/routing_model.py`) in Triton's CPU interpreter
against their twins (`advance_state_reference`, `select_experts_reference`): a batch that
mixes fresh prompts, a chunk continuing its row, a decode step repeating its row's position
(a dropped look-ahead), a row held by another request, and padding; expert counts that are
not powers of two. The integer hashes must match bit for bit; c to float32 rounding.

TRITON_INTERPRET must be set before the kernels are decorated, so in a normal run one test
re-runs this file in a child pytest with TRITON_INTERPRET=1, and the cases run only there."""

from __future__ import annotations

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted

from xinfer.routing.config import PRESETS
from xinfer.routing.parametric import popularity_draw
from xinfer.routing.parametric_ops import (
    RoutingState,
    SequenceBatch,
    advance_state_reference,
    layer_constants,
    select_experts_reference,
)

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(scope="module")
def launch():
    from xinfer.kernels.triton import routing_model as jit
    from xinfer.routing import parametric_launch

    require_interpreted(jit.routing_state_kernel)
    return parametric_launch


def _case(num_experts: int, seed: int, decode: bool = False):
    """A state with rows set up for each carry-in rule, and a batch of 6 sequences (decode:
    one token each)."""
    g = torch.Generator().manual_seed(seed)
    rows = 6
    state = RoutingState.empty(rows, num_experts, torch.device("cpu"))
    state.c.copy_(torch.randn(rows + 1, num_experts, generator=g))
    # row: (key, pos) — 0 continues at 7, 1 repeats 12, 2 held by another key, 3 empty
    for row, (key, pos) in enumerate([(10, 6), (11, 12), (99, 3), (-1, -1), (14, 40), (15, 0)]):
        state.key[row], state.pos[row] = key, pos
    # sequences: (row, key, first position, tokens)
    seqs = [(0, 10, 7, 5), (1, 11, 12, 1), (2, 12, 4, 3), (3, 13, 0, 9), (6, -1, -1, 1),
            (4, 14, 41, 1)]  # fmt: skip
    if decode:
        seqs = [(row, key, pos + n - 1, 1) for row, key, pos, n in seqs]
    lens = [n for *_, n in seqs]
    qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    batch = SequenceBatch(
        qsl,
        torch.tensor([p + n for _, _, p, n in seqs], dtype=torch.int32),
        torch.tensor([r for r, *_ in seqs], dtype=torch.int64),
        torch.tensor([k for _, k, *_ in seqs], dtype=torch.int64),
        decode,
    )
    params = PRESETS["qwen3-30b-a3b"]
    const = layer_constants(
        seed, 2, params.layer_scale(2), params.sigma, params.tau, params.phi,
        popularity_draw(seed, 2, num_experts),
    )  # fmt: skip
    logits = torch.randn(sum(lens), num_experts, generator=g).to(torch.bfloat16)
    return state, batch, const, logits, sum(lens)


def _clone(state: RoutingState) -> RoutingState:
    return RoutingState(state.c.clone(), state.pos.clone(), state.key.clone())


@child_only
@pytest.mark.parametrize(
    ("block_t", "decode"),
    [(None, False), (4, False), (2, False), (None, True)],
    ids=["prefill-one-block", "prefill-block4", "prefill-block2", "decode"],
)
@pytest.mark.parametrize("num_experts", [20, 64, 130])
def test_state_kernel_equals_twin(launch, num_experts, block_t, decode):
    """Prefill: the two scan passes, over one block or several; decode: the per-sequence
    kernel."""
    state, batch, const, _, num_tokens = _case(num_experts, seed=num_experts, decode=decode)
    s_ref, s_tri = _clone(state), _clone(state)
    c_ref, key_ref, pos_ref = advance_state_reference(s_ref, batch, const, num_tokens)
    c_tri, key_tri, pos_tri = launch.advance_state(s_tri, batch, const, num_tokens, block_t)
    assert torch.equal(key_tri, key_ref) and torch.equal(pos_tri, pos_ref)
    torch.testing.assert_close(c_tri, c_ref, rtol=1e-5, atol=1e-5)
    real = [0, 1, 2, 3, 4]  # the scratch row (6) differs by design: twin and kernel use it apart
    for name in ("c", "pos", "key"):
        want, got = getattr(s_ref, name)[real], getattr(s_tri, name)[real]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert int(s_tri.key[5]) == 15 and int(s_tri.pos[5]) == 0  # untouched row


@child_only
@pytest.mark.parametrize(("num_experts", "top_k", "renormalize"), [(20, 3, True), (130, 8, False)])
def test_select_kernel_equals_twin(launch, num_experts, top_k, renormalize):
    state, batch, const, logits, num_tokens = _case(num_experts, seed=7)
    c, keys, positions = advance_state_reference(state, batch, const, num_tokens)
    w_ref, ids_ref = select_experts_reference(c, keys, positions, logits, const, top_k, renormalize)
    w_tri, ids_tri = launch.select_experts(c, keys, positions, logits, const, top_k, renormalize)
    assert torch.equal(ids_tri, ids_ref)
    torch.testing.assert_close(w_tri, w_ref, rtol=1e-5, atol=1e-6)
