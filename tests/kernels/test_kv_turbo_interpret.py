"""The TurboQuant KV-cache kernels (kernels/triton/kv_turbo.py and the attention kernels'
`TURBO_BITS` loader) in Triton's CPU interpreter: the store gives the twin's codes and
scales bit for bit (padding slots untouched, head dims that are not powers of two); decode
(splits merged apart and in the launch, windows, GQA) and prefill attention on a turbo cache
equal the reference on the cache dequantized; the whole `kernels` path as CUDA runs it
(staging, rotations, store, attention) equals the twin's; the rotation kernel equals the
matmul. Attention in float32/float16 (the interpreter's bfloat16 tl.dot is wrong). Runs in a
child pytest (interpreter_child.py)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from interpreter_child import child_only, interpreter_child_test, require_interpreted
from turbo_cases import turbo_paged_case

from xinfer.kernels import reference
from xinfer.kv import turbo
from xinfer.kv.format import TurboQuant

pytest.importorskip("triton")

test_interpreter_child = interpreter_child_test(__file__)
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=4e-3, rtol=4e-3)}


@pytest.fixture(scope="module")
def launch():
    from xinfer.kernels import attn_launch, kv_turbo_launch

    require_interpreted(kv_turbo_launch.turbo_store_kernel)
    require_interpreted(attn_launch.attn_kernels.decode_kernel)
    return attn_launch, kv_turbo_launch


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [16, 40])
@pytest.mark.parametrize("bits", [3, 4])
def test_store_equals_the_twin_bit_for_bit(launch, dtype, head_dim, bits):
    _, store_launch = launch
    g = torch.Generator().manual_seed(head_dim + bits)
    k = (torch.randn(9, 3, head_dim, generator=g) * 3).to(dtype)
    v = torch.randn(9, 3, head_dim, generator=g).to(dtype)
    k[4] = 0  # a zero row: scale 0, no NaN
    slots = torch.tensor([5, 0, 17, -1, 8, 30, -1, 2, 12])  # -1: padding, writes nothing
    fmt = TurboQuant(bits)
    got = turbo.allocate(fmt, 4, 8, 3, head_dim, dtype, k.device)
    want = turbo.allocate(fmt, 4, 8, 3, head_dim, dtype, k.device)
    for a, b in zip(got.tensors(), want.tensors(), strict=True):  # garbage: kept where
        a.copy_(torch.randint(0, 200, a.shape, generator=g).to(a.dtype))  # nothing is stored
        b.copy_(a)
    store_launch.store(k, v, got, slots)
    turbo.store(k, v, want, slots)
    for a, b in zip(got.tensors(), want.tensors(), strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    zero_row = got.k_scales.view(-1, 3)[8]
    assert zero_row.tolist() == [0.0, 0.0, 0.0]
    assert torch.isfinite(got.k_scales.view(-1, 3)[slots[slots >= 0]].float()).all()


def _attend(attn_launch, case, scale, **kwargs):
    q, cache, tables, lens, qsl = case
    return attn_launch.paged_attention(
        q, cache.k_codes, cache.v_codes, tables, lens, qsl, scale, turbo=cache, **kwargs
    )


def _expected(case, dense, scale, window=None):
    q, _, tables, lens, qsl = case
    return reference.paged_attention(q, *dense, tables, lens, qsl, scale, window)


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hq, hk, bits", [(2, 2, 4), (8, 2, 3), (8, 1, 4)])
@pytest.mark.parametrize("fused", [False, True], ids=["merge-apart", "merge-in-launch"])
@pytest.mark.parametrize("window", [None, 20])
def test_decode_on_a_turbo_cache(launch, dtype, hq, hk, bits, fused, window):
    attn_launch, _ = launch
    seq_lens = [1, 17, 90, 0]  # 0: a padding row
    case, dense = turbo_paged_case(dtype, seq_lens, None, hq, hk, bits=bits, seed=hq + bits)
    want = _expected(case, dense, 0.17, window)
    with mock.patch.object(attn_launch, "FUSED_DECODE_REDUCE", fused):
        got = _attend(
            attn_launch, case, 0.17, max_query_len=1, max_seq_len=95, split_len=32,
            sliding_window=window,
        )  # fmt: skip
    torch.testing.assert_close(got, want, **TOL[dtype])
    assert torch.count_nonzero(got[3]) == 0


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hq, hk, bits", [(2, 2, 3), (8, 2, 4)])
@pytest.mark.parametrize("window", [None, 7])
def test_prefill_on_a_turbo_cache(launch, dtype, hq, hk, bits, window):
    attn_launch, _ = launch
    pairs = [(20, 20), (9, 41), (1, 23), (0, 5)]  # (new tokens, cached incl. new)
    case, dense = turbo_paged_case(
        dtype, [s for _, s in pairs], [q for q, _ in pairs], hq, hk, bits=bits, seed=bits
    )
    want = _expected(case, dense, 0.2, window)
    got = _attend(attn_launch, case, 0.2, max_query_len=20, max_seq_len=41, sliding_window=window)
    torch.testing.assert_close(got, want, **TOL[dtype])


@child_only
@pytest.mark.parametrize("bits", [4, 3])
def test_lookup_by_shuffles_gives_the_same_attention(launch, bits):
    """`attn_launch.TURBO_LOOKUP_SHUFFLE`: the centroid table in registers, looked up with
    `tl.gather`, in decode and prefill: the reference on the dequantized cache, as the
    lookup by loads gives."""
    attn_launch, _ = launch
    case, dense = turbo_paged_case(torch.float32, [17, 90], [1, 1], 8, 2, bits=bits, seed=bits)
    q, cache, tables, lens, _ = case
    paged = (q, cache.k_codes, cache.v_codes, tables, lens)
    with mock.patch.object(attn_launch, "TURBO_LOOKUP_SHUFFLE", True):  # the switch reaches
        assert attn_launch._common_args(paged, q)[1]["TURBO_SHUFFLE"] is True  # the kernels
        got = _attend(attn_launch, case, 0.17, max_query_len=1, max_seq_len=95, split_len=32)
    assert attn_launch._common_args(paged, q)[1]["TURBO_SHUFFLE"] is False
    torch.testing.assert_close(got, _expected(case, dense, 0.17), **TOL[torch.float32])
    case, dense = turbo_paged_case(torch.float32, [30, 12], [30, 5], 4, 2, bits=bits, seed=9)
    with mock.patch.object(attn_launch, "TURBO_LOOKUP_SHUFFLE", True):
        got = _attend(attn_launch, case, 0.17, max_query_len=30, max_seq_len=30)
    torch.testing.assert_close(got, _expected(case, dense, 0.17), **TOL[torch.float32])


@child_only
def test_head_dim_24_block_size_4(launch):
    attn_launch, _ = launch
    case, dense = turbo_paged_case(
        torch.float32, [33, 12], [14, 1], hq=6, hk=2, head_dim=24, bits=3, block_size=4
    )
    want = _expected(case, dense, 0.2)
    got = _attend(attn_launch, case, 0.2, max_query_len=14, max_seq_len=33)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


@child_only
def test_the_kernels_path_on_triton_equals_the_twin(launch, monkeypatch, bits=3):
    """`kernels.qkv_prep` + `paged_attention` with a TurboKVCache as CUDA runs them (the
    fused norm + RoPE kernel into the staging buffer, the rotations, the store kernel, the
    attention kernel) against the CPU twin's path: the same codes but where RoPE's last bit
    moves a coordinate across a boundary, and outputs within float32 noise."""
    from xinfer import kernels

    g = torch.Generator().manual_seed(bits)
    hq, hk, head_dim, num_tokens = 4, 2, 32, 21
    q, k, v = (torch.randn(num_tokens, h, head_dim, generator=g) for h in (hq, hk, hk))
    norms = [torch.rand(head_dim, generator=g) + 0.5 for _ in range(2)]
    cos_sin = torch.randn(64, head_dim, generator=g)
    positions = torch.arange(num_tokens)
    slots = torch.arange(num_tokens) + 16  # blocks 1 and 2 of a sequence
    slots[-1] = -1  # padding
    tables = torch.tensor([[1, 2, 0]], dtype=torch.int32)
    lens = torch.tensor([num_tokens - 1], dtype=torch.int32)
    qsl = torch.tensor([0, num_tokens - 1], dtype=torch.int32)
    runs = []
    for on_triton in (False, True):
        monkeypatch.setattr(kernels, "use_triton", lambda t, on=on_triton: on)
        cache = turbo.allocate(TurboQuant(bits), 4, 16, hk, head_dim, torch.float32, k.device)
        q_rope = kernels.qkv_prep(q, k, v, positions, cos_sin, cache, None, slots, *norms, 1e-6)
        out = kernels.paged_attention(
            q_rope[:-1], cache, None, tables, lens, qsl, 0.2, max_query_len=20, max_seq_len=20
        )
        runs.append((cache, out))
    (twin, want), (tri, got) = runs
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    same = (tri.k_codes == twin.k_codes).float().mean() * (
        tri.v_codes == twin.v_codes
    ).float().mean()
    assert same > 0.99
    torch.testing.assert_close(tri.k_scales, twin.k_scales, atol=1e-3, rtol=1e-3)
    # v's rotation: the kernel's float32 dot against the twin's matmul, not the same bits
    torch.testing.assert_close(tri.v_scales, twin.v_scales, atol=1e-3, rtol=1e-3)


@child_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [16, 40, 128])
def test_rotation_kernel_is_the_matmul(launch, dtype, head_dim):
    """`kv_turbo_launch.rotate` (rows times R^T as a transposed view, and times R; a row
    count that is not a multiple of the 16-row tile) within rounding of the float64
    product."""
    from xinfer.kv.turbo_codebook import rotation

    _, turbo_launch = launch
    rot = rotation(head_dim).to(dtype)
    x = torch.randn(37, 3, head_dim, generator=torch.Generator().manual_seed(head_dim)).to(dtype)
    for m in (rot.t(), rot):
        got = turbo_launch.rotate(x, m)
        assert got.shape == x.shape and got.dtype == dtype
        torch.testing.assert_close(got, (x.double() @ m.double()).to(dtype), **TOL[dtype])


def _ragged_batch(bits, head_dim, seed):
    """The tiny qwen3_moe engine's shapes (4 query heads on 2 KV heads, blocks of 16): six
    sequences of different lengths in shuffled blocks, each with its new tokens' slots
    (a cached prefix that ends inside a block for two of them), and their k, v, q."""
    g = torch.Generator().manual_seed(seed)
    hq, hk, block = 4, 2, 16
    seq_lens = [5, 17, 9, 30, 2, 12]
    query_lens = [5, 17, 9, 7, 2, 3]  # 30 - 7 and 12 - 3: prefixes ending mid-block
    tables = torch.randperm(24, generator=g).view(6, 4).to(torch.int32)
    pos = [torch.arange(s) for s in seq_lens]
    slots = torch.cat([tables[i, p // block].long() * block + p % block for i, p in enumerate(pos)])
    total = sum(seq_lens)
    k = torch.randn(total, hk, head_dim, generator=g) * 2
    v = torch.randn(total, hk, head_dim, generator=g)
    q = torch.randn(sum(query_lens), hq, head_dim, generator=g)
    cache = turbo.allocate(TurboQuant(bits), 24, block, hk, head_dim, torch.float32, k.device)
    return cache, k, v, slots, q, tables, seq_lens, query_lens


def _bounds(lens):
    return torch.tensor([0, *lens]).cumsum(0).tolist()


@child_only
@pytest.mark.parametrize("bits, head_dim", [(4, 16), (3, 16), (4, 40)])
def test_ragged_batch_gives_each_sequence_its_result_alone(launch, bits, head_dim):
    """The TurboQuant paths of a batch of several sequences (the engine's greedy batch-
    invariance test, tests/kernels/test_kv_turbo_gpu.py): the store of every token in one
    launch gives the codes of one launch a sequence and the twin's; prefill over the ragged
    batch gives each sequence the bits it gets alone, and the reference on the dequantized
    cache; batched decode over different context lengths likewise; and a prompt's last token
    attended by the decode kernel (what a prefix-cache hit leaves to compute) matches its
    row of the prefill."""
    attn_launch, store_launch = launch
    cache, k, v, slots, q, tables, seq_lens, query_lens = _ragged_batch(bits, head_dim, bits)
    tok = _bounds(seq_lens)
    store_launch.store(k, v, cache, slots)
    alone = turbo.allocate(TurboQuant(bits), 24, 16, 2, head_dim, torch.float32, k.device)
    for i in range(len(seq_lens)):
        store_launch.store(k[tok[i] : tok[i + 1]], v[tok[i] : tok[i + 1]], alone,
                           slots[tok[i] : tok[i + 1]])  # fmt: skip
    twin = turbo.allocate(TurboQuant(bits), 24, 16, 2, head_dim, torch.float32, k.device)
    turbo.store(k, v, twin, slots)
    for got, one, want in zip(cache.tensors(), alone.tensors(), twin.tensors(), strict=True):
        assert torch.equal(got.view(torch.uint8), one.view(torch.uint8))
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))

    planes = ((cache.k_codes, cache.k_scales), (cache.v_codes, cache.v_scales))
    dense = [turbo.dequantize(c, s, cache.centroids, bits) for c, s in planes]

    def attend(q_rows, rows, qlens, **kw):
        """The kernel on sequences `rows` (queries q_rows, new tokens qlens), and the
        reference on the dequantized cache."""
        lens = torch.tensor([seq_lens[i] for i in rows], dtype=torch.int32)
        qsl = torch.tensor(_bounds(qlens), dtype=torch.int32)
        case = (q_rows, cache, tables[rows], lens, qsl)
        return _attend(attn_launch, case, 0.25, **kw), _expected(case, dense, 0.25)

    rows = list(range(len(seq_lens)))
    qt = _bounds(query_lens)
    together, want = attend(q, rows, query_lens, max_query_len=30, max_seq_len=30)
    torch.testing.assert_close(together, want, **TOL[torch.float32])
    for i in rows:
        mine = slice(qt[i], qt[i + 1])
        one, _ = attend(q[mine], [i], [query_lens[i]], max_query_len=query_lens[i],
                        max_seq_len=seq_lens[i])  # fmt: skip
        assert torch.equal(one, together[mine]), f"prefill of sequence {i}"
        last = q[qt[i + 1] - 1 : qt[i + 1]]  # the last token alone, by the decode kernel
        by_decode, _ = attend(last, [i], [1], max_query_len=1, max_seq_len=512)
        torch.testing.assert_close(by_decode[0], together[qt[i + 1] - 1], **TOL[torch.float32])
    q_dec = torch.randn(len(rows), 4, head_dim, generator=torch.Generator().manual_seed(9))
    batched, want = attend(q_dec, rows, [1] * len(rows), max_query_len=1, max_seq_len=512)
    torch.testing.assert_close(batched, want, **TOL[torch.float32])
    for i in rows:
        one, _ = attend(q_dec[i : i + 1], [i], [1], max_query_len=1, max_seq_len=512)
        assert torch.equal(one[0], batched[i]), f"decode of sequence {i}"
