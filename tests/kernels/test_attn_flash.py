"""The FA2 long-prompt path (`kernels/attn_flash.py`, `XINFER_PREFILL_ATTENTION=flash`): its
gather and log-sum-exp merge against `reference.paged_attention` on CPU, with torch's CPU
flash forward standing in for the CUDA one (K/V heads repeated: the CPU op has no GQA); when
it is chosen; and, on the GPU, the real FA2 against the reference and the Triton kernel."""

from __future__ import annotations

import pytest
import torch

from xinfer import envs, kernels
from xinfer.errors import UserError
from xinfer.kernels import attn_flash, reference


def _cpu_flash(q, k, v, dropout_p, is_causal, scale=None):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, dropout_p, is_causal, scale=scale
    )


def _case(new: int, seq_len: int, dtype, device, hq=8, hk=2, d=64, block=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = -(-seq_len // block) + 3
    shape = (num_blocks, block, hk, d)
    k = torch.randn(shape, generator=g).to(device, dtype)
    v = torch.randn(shape, generator=g).to(device, dtype)
    table = torch.randperm(num_blocks, generator=g).to(device, torch.int32)[None, :]
    q = torch.randn(new, hq, d, generator=g).to(device, dtype)
    lens = torch.tensor([seq_len], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, new], dtype=torch.int32, device=device)
    return q, k, v, table, lens, qsl


@pytest.mark.parametrize("new,seq_len", [(40, 40), (40, 123), (33, 300)])
def test_gather_and_merge_equal_the_reference(monkeypatch, new, seq_len) -> None:
    monkeypatch.setattr(attn_flash, "flash_forward", lambda: _cpu_flash)
    q, k, v, table, lens, qsl = _case(new, seq_len, torch.float32, "cpu")
    scale = q.shape[-1] ** -0.5
    got = attn_flash.prefill_one_sequence(q, k, v, table[0], seq_len, scale)
    want = reference.paged_attention(q, k, v, table, lens, qsl, scale)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_merge_of_one_set_split_in_two_is_the_whole() -> None:
    g = torch.Generator().manual_seed(1)
    scores, vals = torch.randn(3, 5, 12, generator=g), torch.randn(12, 4, generator=g)
    whole = torch.softmax(scores, -1) @ vals
    parts = [(torch.softmax(s, -1) @ v, torch.logsumexp(s, -1))
             for s, v in ((scores[..., :7], vals[:7]), (scores[..., 7:], vals[7:]))]  # fmt: skip
    torch.testing.assert_close(attn_flash.merge(*parts[0], *parts[1]), whole)


def test_the_option_is_validated_and_off_by_default(monkeypatch) -> None:
    monkeypatch.delenv("XINFER_PREFILL_ATTENTION", raising=False)
    assert envs.XINFER_PREFILL_ATTENTION() == "triton"
    monkeypatch.setenv("XINFER_PREFILL_ATTENTION", "Flash")
    assert envs.XINFER_PREFILL_ATTENTION() == "flash"
    monkeypatch.setenv("XINFER_PREFILL_ATTENTION", "fa3")
    with pytest.raises(UserError, match="XINFER_PREFILL_ATTENTION"):
        envs.XINFER_PREFILL_ATTENTION()


def test_the_engine_refuses_a_bad_switch_before_loading(monkeypatch, tmp_path) -> None:
    from tiny_models import make_hf_model, write_checkpoint

    from xinfer import LLM

    ckpt = str(write_checkpoint(make_hf_model("qwen3_moe"), tmp_path / "m"))
    monkeypatch.setenv("XINFER_PREFILL_ATTENTION", "fa3")
    with pytest.raises(UserError, match="XINFER_PREFILL_ATTENTION must be triton or flash"):
        LLM(ckpt, device="cpu")


def test_cpu_calls_keep_the_reference(monkeypatch) -> None:
    monkeypatch.setenv("XINFER_PREFILL_ATTENTION", "flash")
    q, k, v, table, lens, qsl = _case(1024, 1500, torch.bfloat16, "cpu")
    assert not attn_flash.wanted(q, k, table, 1024, 1500, None)


@pytest.mark.gpu
@pytest.mark.parametrize("new,seq_len", [(1024, 1024), (1024, 5000), (2048, 2048 + 16 * 37 + 5)])
def test_fa2_equals_the_reference_and_the_triton_kernel(monkeypatch, new, seq_len) -> None:
    q, k, v, table, lens, qsl = _case(new, seq_len, torch.bfloat16, "cuda", hq=32, hk=4, d=128)
    scale = q.shape[-1] ** -0.5
    args = (q, k, v, table, lens, qsl, scale)
    monkeypatch.setenv("XINFER_PREFILL_ATTENTION", "flash")
    assert attn_flash.wanted(q, k, table, new, seq_len, None)
    assert not attn_flash.wanted(q, k, table, new, seq_len, 4096)  # a window: Triton
    flash = kernels.paged_attention(*args, max_query_len=new, max_seq_len=seq_len)
    monkeypatch.setenv("XINFER_PREFILL_ATTENTION", "triton")
    triton_out = kernels.paged_attention(*args, max_query_len=new, max_seq_len=seq_len)
    want = reference.paged_attention(q.float(), k.float(), v.float(), table, lens, qsl, scale)
    torch.testing.assert_close(flash.float(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(flash, triton_out, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_fa2_path_replays_the_same_bits(monkeypatch) -> None:
    """Deterministic: the same call twice gives the same bits."""
    monkeypatch.setenv("XINFER_PREFILL_ATTENTION", "flash")
    q, k, v, table, lens, qsl = _case(1024, 3000, torch.bfloat16, "cuda", hq=32, hk=4, d=128)
    a = attn_flash.prefill_one_sequence(q, k, v, table[0], 3000, 0.1)
    b = attn_flash.prefill_one_sequence(q, k, v, table[0], 3000, 0.1)
    assert torch.equal(a, b)
