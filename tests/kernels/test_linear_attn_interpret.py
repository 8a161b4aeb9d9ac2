"""The linear-attention kernels (causal conv1d prefill/update, chunked gated delta rule,
recurrent step, gated RMSNorm, sigmoid output gate) run by Triton's CPU interpreter against
their twins in `linear_attn_reference`, on packed sequences that span several token blocks
and chunks, sequences that continue from a state slot, fresh ones, a one-token span, a
padding row (state id -1, which must write nothing), strided views of a projection output,
head / channel sizes that are not block multiples, and one or two (double-buffered) state
rows per slot. The twins themselves are checked
against transformers and the naive recurrence in `test_linear_attn_twins.py`.

TRITON_INTERPRET must be set before the kernels are decorated, so a normal run re-runs this
file in a child pytest (see `interpreter_child.py`)."""

from __future__ import annotations

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture(scope="module")
def launch():
    from xinfer.kernels import linear_attn_launch
    from xinfer.kernels.triton import gated_delta_rule as jit

    require_interpreted(jit.chunk_forward_kernel)
    return linear_attn_launch


def _packed(lens: list[int], prev: list[int], ids: list[int]):
    """query_start_loc, seq_lens (previous + new tokens) and state ids as int32 tensors."""
    qsl = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor([p + n for p, n in zip(prev, lens)], dtype=torch.int32)
    return qsl, seq_lens, torch.tensor(ids, dtype=torch.int32)


# spans: long (two token blocks / chunks) fresh, short continuing (shorter than K-1),
# one token continuing, padding (id -1, no state), medium continuing
LENS, PREV, IDS = [70, 2, 1, 5, 20], [0, 9, 30, 4, 3], [3, 0, 4, -1, 1]
NUM_SLOTS = 6


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)


# float32 with one state row per slot, bfloat16 with two (double-buffered) rows
DTYPE_COPIES = [(torch.float32, 1), (torch.bfloat16, 2)]


@child_only
@pytest.mark.parametrize("dtype, copies", DTYPE_COPIES)
def test_conv1d_prefill_and_states(launch, dtype, copies):
    from xinfer.kernels import linear_attn_reference as ref

    g = torch.Generator().manual_seed(0)
    channels, k = 150, 4  # two channel blocks, the second partial
    qsl, seq_lens, ids = _packed(LENS, PREV, IDS)
    proj = torch.randn(int(qsl[-1]), channels + 24, generator=g).to(dtype)
    x = proj[:, 8 : 8 + channels]  # a strided view, as the split of a projection
    weight = torch.randn(channels, k, generator=g).to(dtype)
    states = torch.randn(NUM_SLOTS * copies, k - 1, channels, generator=g).to(dtype)
    s_ref, s_got = states.clone(), states.clone()
    want = ref.causal_conv1d_prefill(x, weight, s_ref, ids, qsl, seq_lens, copies)
    got = launch.causal_conv1d_prefill(x, weight, s_got, ids, qsl, seq_lens, max(LENS), copies)
    torch.testing.assert_close(got, want, **_tol(dtype))
    torch.testing.assert_close(s_got, s_ref, atol=0, rtol=0)  # states are copies of inputs
    unowned = [r for s in (2, 5) for r in range(s * copies, (s + 1) * copies)]
    assert torch.equal(s_got[unowned], states[unowned])  # slots nobody owns stay as they were
    assert not torch.equal(s_got, states)


@child_only
@pytest.mark.parametrize("dtype, copies", DTYPE_COPIES)
def test_conv1d_update(launch, dtype, copies):
    from xinfer.kernels import linear_attn_reference as ref

    g = torch.Generator().manual_seed(1)
    channels, k = 150, 4
    ids = torch.tensor([2, -1, 0, 5], dtype=torch.int32)
    seq_lens = torch.tensor([7, 1, 1, 40], dtype=torch.int32)  # row 2 starts fresh
    x = torch.randn(4, channels + 8, generator=g).to(dtype)[:, :channels]
    weight = torch.randn(channels, k, generator=g).to(dtype)
    states = torch.randn(NUM_SLOTS * copies, k - 1, channels, generator=g).to(dtype)
    s_ref, s_got = states.clone(), states.clone()
    want = ref.causal_conv1d_update(x, weight, s_ref, ids, seq_lens, copies)
    got = launch.causal_conv1d_update(x, weight, s_got, ids, seq_lens, copies)
    torch.testing.assert_close(got, want, **_tol(dtype))
    torch.testing.assert_close(s_got, s_ref, atol=0, rtol=0)


def _delta_inputs(
    num_tokens: int, dtype: torch.dtype, seed: int, hk=2, hv=4, dk=24, dv=80, copies=1
):
    """q, k, v, a, b as views of one projection output, as the layer splits it."""
    g = torch.Generator().manual_seed(seed)
    widths = [hk * dk, hk * dk, hv * dv, hv, hv]
    proj = torch.randn(num_tokens, sum(widths) + 8, generator=g).to(dtype)
    q, k, v, a, b = proj[:, : sum(widths)].split(widths, dim=-1)
    q, k = q.view(num_tokens, hk, dk), k.view(num_tokens, hk, dk)
    v = v.view(num_tokens, hv, dv)
    a_log = torch.empty(hv).uniform_(0.5, 16, generator=g).log()
    dt_bias = torch.rand(hv, generator=g)
    states = torch.randn(NUM_SLOTS * copies, hv, dk, dv, generator=g)
    return [q, k, v, a, b, a_log.to(dtype), dt_bias.to(dtype)], states


@child_only
@pytest.mark.parametrize("dtype, copies", DTYPE_COPIES)
def test_chunked_delta_rule(launch, dtype, copies):
    from xinfer.kernels import linear_attn_reference as ref

    qsl, seq_lens, ids = _packed(LENS, PREV, IDS)
    args, states = _delta_inputs(int(qsl[-1]), dtype, seed=2, hk=1, hv=2, copies=copies)
    s_ref, s_got = states.clone(), states.clone()
    want = ref.gated_delta_rule_prefill(*args, s_ref, ids, qsl, seq_lens, copies)
    got = launch.gated_delta_rule_prefill(*args, s_got, ids, qsl, seq_lens, max(LENS), copies)
    torch.testing.assert_close(got, want, **_tol(dtype))
    torch.testing.assert_close(s_got, s_ref, atol=1e-4, rtol=1e-4)
    unowned = [r for s in (2, 5) for r in range(s * copies, (s + 1) * copies)]
    assert torch.equal(s_got[unowned], states[unowned])


@child_only
@pytest.mark.parametrize("dtype, copies", DTYPE_COPIES)
def test_recurrent_step(launch, dtype, copies):
    from xinfer.kernels import linear_attn_reference as ref

    ids = torch.tensor([2, -1, 0, 5, 1], dtype=torch.int32)
    seq_lens = torch.tensor([7, 1, 1, 40, 3], dtype=torch.int32)
    args, states = _delta_inputs(5, dtype, seed=3, copies=copies)
    s_ref, s_got = states.clone(), states.clone()
    want = ref.gated_delta_rule_decode(*args, s_ref, ids, seq_lens, copies)
    got = launch.gated_delta_rule_decode(*args, s_got, ids, seq_lens, copies)
    torch.testing.assert_close(got, want, **_tol(dtype))
    torch.testing.assert_close(s_got, s_ref, atol=1e-5, rtol=1e-5)
    unowned = [r for s in (3, 4) for r in range(s * copies, (s + 1) * copies)]
    assert torch.equal(s_got[unowned], states[unowned])


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_rms_norm(launch, dtype):
    from xinfer.kernels import linear_attn_reference as ref

    g = torch.Generator().manual_seed(4)
    x = torch.randn(7, 3, 40, generator=g).to(dtype)
    z = torch.randn(7, 3 * 40 + 16, generator=g).to(dtype)[:, 16:].view(7, 3, 40)
    weight = torch.randn(40, generator=g).to(dtype)
    want = ref.gated_rms_norm(x, z, weight, 1e-6)
    got = launch.gated_rms_norm(x, z, weight, 1e-6)
    torch.testing.assert_close(got, want, **_tol(dtype))


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sigmoid_gate_mul(launch, dtype):
    from xinfer.kernels import linear_attn_reference as ref

    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 4, 24, generator=g).to(dtype)
    gate = torch.randn(6, 4, 48, generator=g).to(dtype)[..., 24:]  # q|gate interleaved per head
    want = ref.sigmoid_gate_mul(x, gate)
    got = launch.sigmoid_gate_mul(x, gate)
    torch.testing.assert_close(got, want, **_tol(dtype))
