"""The compiled linear-attention kernels on the GPU against their twins, at Qwen3.5-35B-A3B's
shapes (16 key / 32 value heads of 128, conv over 8192 channels) and odd ones; the decode
kernels replayed inside a CUDA graph with the state slots read from a static buffer; and
batch invariance (a sequence's outputs and state do not depend on what else is batched)."""

from __future__ import annotations

import pytest
import torch

from xinfer.kernels import linear_attn_reference as ref

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.fixture(scope="module")
def launch():
    from xinfer.kernels import linear_attn_launch

    return linear_attn_launch


def _packed(lens, prev, ids):
    qsl = torch.tensor([0] + lens).cumsum(0).to(torch.int32).to(DEV)
    seq_lens = torch.tensor([p + n for p, n in zip(prev, lens)], dtype=torch.int32, device=DEV)
    return qsl, seq_lens, torch.tensor(ids, dtype=torch.int32, device=DEV)


def _tol(dtype):
    return dict(atol=2e-4, rtol=2e-4) if dtype == torch.float32 else dict(atol=4e-2, rtol=4e-2)


def _inputs(num_tokens, dtype, seed, hk=16, hv=32, dk=128, dv=128, num_slots=8):
    g = torch.Generator(device=DEV).manual_seed(seed)
    widths = [hk * dk, hk * dk, hv * dv, hv, hv]
    proj = torch.randn(num_tokens, sum(widths), generator=g, device=DEV).to(dtype)
    q, k, v, a, b = proj.split(widths, dim=-1)
    q, k, v = q.view(num_tokens, hk, dk), k.view(num_tokens, hk, dk), v.view(num_tokens, hv, dv)
    a_log = torch.empty(hv, device=DEV).uniform_(0.5, 16, generator=g).log().to(dtype)
    dt_bias = torch.rand(hv, generator=g, device=DEV).to(dtype)
    states = torch.randn(num_slots, hv, dk, dv, generator=g, device=DEV)
    return [q, k, v, a, b, a_log, dt_bias], states


LENS, PREV, IDS = [300, 3, 1, 64, 129], [0, 11, 40, 7, 0], [5, 0, 2, -1, 7]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [dict(), dict(hk=2, hv=6, dk=48, dv=80)])
def test_chunked_delta_rule(launch, dtype, shape):
    qsl, seq_lens, ids = _packed(LENS, PREV, IDS)
    args, states = _inputs(sum(LENS), dtype, 0, **shape)
    s_ref, s_got = states.clone(), states.clone()
    want = ref.gated_delta_rule_prefill(*args, s_ref, ids, qsl, seq_lens)
    got = launch.gated_delta_rule_prefill(*args, s_got, ids, qsl, seq_lens, max(LENS))
    torch.testing.assert_close(got, want, **_tol(dtype))
    torch.testing.assert_close(s_got, s_ref, **_tol(dtype))
    assert torch.equal(s_got[[1, 3, 4, 6]], states[[1, 3, 4, 6]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_prefill_and_update(launch, dtype):
    g = torch.Generator(device=DEV).manual_seed(1)
    channels, width = 8192 + 40, 4
    qsl, seq_lens, ids = _packed(LENS, PREV, IDS)
    x = torch.randn(sum(LENS), channels + 64, generator=g, device=DEV).to(dtype)[:, :channels]
    w = torch.randn(channels, width, generator=g, device=DEV).to(dtype)
    states = torch.randn(8, width - 1, channels, generator=g, device=DEV).to(dtype)
    s_ref, s_got = states.clone(), states.clone()
    want = ref.causal_conv1d_prefill(x, w, s_ref, ids, qsl, seq_lens)
    got = launch.causal_conv1d_prefill(x, w, s_got, ids, qsl, seq_lens, max(LENS))
    torch.testing.assert_close(got, want, **_tol(dtype))
    assert torch.equal(s_got, s_ref)
    step = x[:5]
    want = ref.causal_conv1d_update(step, w, s_ref, ids, seq_lens + 1)
    got = launch.causal_conv1d_update(step, w, s_got, ids, seq_lens + 1)
    torch.testing.assert_close(got, want, **_tol(dtype))
    assert torch.equal(s_got, s_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gates(launch, dtype):
    g = torch.Generator(device=DEV).manual_seed(2)
    x = torch.randn(37, 32, 128, generator=g, device=DEV).to(dtype)
    z = torch.randn(37, 32 * 128 + 64, generator=g, device=DEV).to(dtype)[:, 64:]
    w = torch.randn(128, generator=g, device=DEV).to(dtype)
    z = z.view(37, 32, 128)
    torch.testing.assert_close(
        launch.gated_rms_norm(x, z, w, 1e-6), ref.gated_rms_norm(x, z, w, 1e-6), **_tol(dtype)
    )
    q_gate = torch.randn(37, 16, 512, generator=g, device=DEV).to(dtype)
    out = torch.randn(37, 16, 256, generator=g, device=DEV).to(dtype)
    gate = q_gate[..., 256:]
    got, want = launch.sigmoid_gate_mul(out, gate), ref.sigmoid_gate_mul(out, gate)
    torch.testing.assert_close(got, want, **_tol(dtype))


def test_decode_kernels_replay_in_a_cuda_graph(launch):
    """conv update + recurrent step captured once; replays with other rows' slots, lengths
    and inputs (written into the static buffers) equal the twins."""
    dtype, batch, channels = torch.bfloat16, 6, 2 * 16 * 128 + 32 * 128
    args, states = _inputs(batch, dtype, 3)
    g = torch.Generator(device=DEV).manual_seed(4)
    w = torch.randn(channels, 4, generator=g, device=DEV).to(dtype)
    conv_states = torch.randn(8, 3, channels, generator=g, device=DEV).to(dtype)
    x = torch.randn(batch, channels, generator=g, device=DEV).to(dtype)
    ids = torch.full((batch,), -1, dtype=torch.int32, device=DEV)
    lens = torch.zeros(batch, dtype=torch.int32, device=DEV)
    static = [t.clone() for t in args[:5]]

    def step():
        mixed = launch.causal_conv1d_update(x, w, conv_states, ids, lens)
        out = launch.gated_delta_rule_decode(*static, *args[5:], states, ids, lens)
        return mixed, out

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for seed, rows in ((5, [3, 0, 7, -1, 1, 6]), (6, [2, 4, -1, -1, 5, 0])):
        new, _ = _inputs(batch, dtype, seed)
        for dst, src in zip(static, new[:5]):
            dst.copy_(src)
        x.copy_(torch.randn(batch, channels, generator=g, device=DEV).to(dtype))
        ids.copy_(torch.tensor(rows, dtype=torch.int32))
        lens.copy_(torch.tensor([9, 1, 30, 0, 2, 5], dtype=torch.int32))
        c_ref, s_ref = conv_states.clone(), states.clone()
        want_mixed = ref.causal_conv1d_update(x, w, c_ref, ids, lens)
        want_out = ref.gated_delta_rule_decode(*static, *args[5:], s_ref, ids, lens)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(outs[0], want_mixed, **_tol(dtype))
        torch.testing.assert_close(outs[1], want_out, **_tol(dtype))
        assert torch.equal(conv_states, c_ref)
        torch.testing.assert_close(states, s_ref, atol=1e-5, rtol=1e-5)


def test_batch_invariance(launch):
    """The 129-token sequence alone, then among others: bit-identical outputs and state."""
    dtype = torch.bfloat16
    qsl, seq_lens, ids = _packed(LENS, PREV, IDS)
    args, states = _inputs(sum(LENS), dtype, 7)
    s_batch, s_alone = states.clone(), states.clone()
    batched = launch.gated_delta_rule_prefill(*args, s_batch, ids, qsl, seq_lens, max(LENS))
    start = sum(LENS[:4])
    span = slice(start, start + LENS[4])
    alone_args = [t[span] for t in args[:5]] + args[5:]
    qsl1, lens1, ids1 = _packed([LENS[4]], [PREV[4]], [IDS[4]])
    alone = launch.gated_delta_rule_prefill(*alone_args, s_alone, ids1, qsl1, lens1, LENS[4])
    assert torch.equal(batched[span], alone)
    assert torch.equal(s_batch[IDS[4]], s_alone[IDS[4]])
