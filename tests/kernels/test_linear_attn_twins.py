"""The linear-attention twins (`linear_attn_reference`) against transformers' Qwen3-Next
functions (chunked and recurrent gated delta rule, causal conv1d) and against the naive
token-by-token recurrence, on packed sequences that continue from state slots, so that the
Triton kernels' ground truth is itself checked."""

from __future__ import annotations

import pytest
import torch

from xinfer.kernels import linear_attn_reference as ref

hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

LENS, PREV, IDS = [70, 5, 130], [0, 10, 0], [3, 0, 1]
HK, HV, DK, DV = 2, 4, 16, 8


def _packed():
    qsl = torch.tensor([0] + LENS).cumsum(0)
    return qsl, torch.tensor([p + n for p, n in zip(PREV, LENS)]), torch.tensor(IDS)


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    t = sum(LENS)
    q, k = torch.randn(t, HK, DK, generator=g), torch.randn(t, HK, DK, generator=g)
    v, a, b = torch.randn(t, HV, DV, generator=g), *torch.randn(2, t, HV, generator=g)
    a_log, dt_bias = torch.rand(HV, generator=g).log(), torch.rand(HV, generator=g)
    return q, k, v, a, b, a_log, dt_bias


def test_chunked_rule_matches_transformers_and_the_recurrence():
    q, k, v, a, b, a_log, dt_bias = _inputs()
    qsl, seq_lens, ids = _packed()
    states = torch.randn(5, HV, DK, DV)
    before = states.clone()
    out = ref.gated_delta_rule_prefill(q, k, v, a, b, a_log, dt_bias, states, ids, qsl, seq_lens)
    g, beta = ref.gate_and_beta(a, b, a_log, dt_bias)
    for i, n in enumerate(LENS):
        span = slice(int(qsl[i]), int(qsl[i]) + n)
        init = before[IDS[i]][None] if PREV[i] else None
        qq, kk = (x[span].repeat_interleave(HV // HK, 1)[None] for x in (q, k))
        args = dict(g=g[span][None], beta=beta[span][None], initial_state=init)
        for fn in (hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule):
            o, final = fn(
                qq, kk, v[span][None], **args, output_final_state=True, use_qk_l2norm_in_kernel=True
            )
            torch.testing.assert_close(out[span], o[0], atol=2e-6, rtol=1e-5)
            torch.testing.assert_close(states[IDS[i]], final[0], atol=2e-6, rtol=1e-5)
    assert torch.equal(states[[2, 4]], before[[2, 4]])


def test_naive_recurrence_equals_chunked_span():
    q, k, v, a, b, a_log, dt_bias = _inputs(1)
    g, beta = ref.gate_and_beta(a, b, a_log, dt_bias)
    qh, kh = ref._heads(q, k, HV)
    init = torch.randn(HV, DK, DV)
    naive, s1 = ref.gated_delta_rule_recurrent(qh, kh, v, g, beta, init)
    chunked, s2 = ref._chunked_span(qh, kh, v, g, beta, init)
    torch.testing.assert_close(chunked, naive, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(s2, s1, atol=2e-6, rtol=1e-5)


def test_decode_step_matches_transformers():
    q, k, v, a, b, a_log, dt_bias = (t[:3] if t.dim() > 1 else t for t in _inputs(2))
    states = torch.randn(5, HV, DK, DV)
    before = states.clone()
    ids, seq_lens = torch.tensor([3, -1, 1]), torch.tensor([71, 1, 131])
    out = ref.gated_delta_rule_decode(q, k, v, a, b, a_log, dt_bias, states, ids, seq_lens)
    g, beta = ref.gate_and_beta(a, b, a_log, dt_bias)
    for row in (0, 2):
        qq, kk = (x[row : row + 1, None].repeat_interleave(HV // HK, 2) for x in (q, k))
        o, final = hf.torch_recurrent_gated_delta_rule(
            qq, kk, v[row : row + 1, None], g=g[row : row + 1, None],
            beta=beta[row : row + 1, None], initial_state=before[ids[row]][None],
            output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        torch.testing.assert_close(out[row], o[0, 0])
        torch.testing.assert_close(states[ids[row]], final[0])
    assert torch.equal(states[[0, 2, 4]], before[[0, 2, 4]])  # padding wrote nothing


def test_conv_matches_transformers():
    qsl, seq_lens, ids = _packed()
    channels, width = 6, 4
    x, w = torch.randn(sum(LENS), channels), torch.randn(channels, width)
    states = torch.randn(5, width - 1, channels)
    before = states.clone()
    out = ref.causal_conv1d_prefill(x, w, states, ids, qsl, seq_lens)
    for i, n in enumerate(LENS):
        xs = x[int(qsl[i]) : int(qsl[i]) + n]
        prev = before[IDS[i]] if PREV[i] else torch.zeros(width - 1, channels)
        full = torch.cat([prev, xs]).t()[None]
        want = hf.causal_conv1d_fn(full, w, None, "silu")[0, :, width - 1 :].t()
        torch.testing.assert_close(out[int(qsl[i]) : int(qsl[i]) + n], want)
        torch.testing.assert_close(states[IDS[i]], torch.cat([prev, xs])[-(width - 1) :])
    # one decode step == transformers' cached update (whose state holds K inputs)
    x1 = torch.randn(1, channels)
    hf_state = torch.cat([torch.zeros(1, channels, 1), states[3].t()[None]], -1)
    want = hf.causal_conv1d_update(x1[..., None].clone(), hf_state, w, None, "silu")[..., 0]
    got = ref.causal_conv1d_update(x1, w, states, torch.tensor([3]), torch.tensor([71]))
    torch.testing.assert_close(got, want)


def test_double_buffered_rows_read_one_parity_and_write_the_other():
    """Two rows per slot: a step reads row 2·slot + cached % 2 and writes 2·slot + len % 2,
    with the same results as one row per slot; the row it read is left as it was."""
    q, k, v, a, b, a_log, dt_bias = _inputs(3)
    qsl, seq_lens, ids = _packed()
    single = torch.randn(5, HV, DK, DV)
    double = single.repeat_interleave(2, dim=0)  # both rows of each slot hold its state
    args = (q, k, v, a, b, a_log, dt_bias)
    out1 = ref.gated_delta_rule_prefill(*args, single, ids, qsl, seq_lens)
    before = double.clone()
    out2 = ref.gated_delta_rule_prefill(*args, double, ids, qsl, seq_lens, copies=2)
    assert torch.equal(out1, out2)
    for sid, prev, n in zip(IDS, PREV, LENS):
        read, write = ref.state_rows(sid, prev, prev + n, 2)
        assert torch.equal(double[write], single[sid])
        if read != write:
            assert torch.equal(double[read], before[read])
    conv1 = torch.randn(5, 3, 6)
    conv2 = conv1.repeat_interleave(2, dim=0)
    x, w = torch.randn(sum(LENS), 6), torch.randn(6, 4)
    o1 = ref.causal_conv1d_prefill(x, w, conv1, ids, qsl, seq_lens)
    o2 = ref.causal_conv1d_prefill(x, w, conv2, ids, qsl, seq_lens, copies=2)
    assert torch.equal(o1, o2)
    for sid, prev, n in zip(IDS, PREV, LENS):
        assert torch.equal(conv2[ref.state_rows(sid, prev, prev + n, 2)[1]], conv1[sid])
