"""`--moe-offload-compress`: bf16 experts packed in the host store (offload/packed.py).

The packing is lossless bit for bit (random N(0, σ) rows with zeros, -0.0, subnormals, inf,
NaN payloads and huge values among them: escapes, in one block and across blocks), checked
against an unpacker written here from the layout alone; it declines what it cannot pack or
would not shrink; on N(0, 0.02) weights it takes 3/4 of the bytes. Through the engine (bf16
on CPU, four architectures): greedy output equals no offload at 0.1 / 0.25 / 0.5, batched
(overflow rows) and with a prompt pass (the staging path unpacks too), with either slot
policy and with prefetch; the stats count what crossed the link (packed bytes) and the store is
smaller. Architectures: plain MoE, Mixtral, the hybrid Qwen3.5 (linear attention, a shared
expert) and Qwen1.5-MoE (a gated shared expert). Start-up: the next layer's plane buffers
are made on a helper thread while a layer packs, with the same packings; a plain bf16
offload names the option in its log."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams
from xinfer.offload.packed import (
    ESCAPE,
    PACK_BLOCK,
    PackedExperts,
    densest_window,
    pack_experts,
    pack_layer,
    stored_row_bytes,
    unpacked_row_bytes,
)

SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -3e-39, 3e38, 1.0]


def _weights(num_experts: int, n: int, seed: int, specials: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    t = (torch.randn(num_experts, n, generator=gen) * 0.02).to(torch.bfloat16)
    for i in range(specials):
        e = int(torch.randint(num_experts, (1,), generator=gen))
        j = int(torch.randint(n, (1,), generator=gen))
        t[e, j] = SPECIALS[i % len(SPECIALS)]
    return t


def unpack_by_the_layout(p: PackedExperts, expert: int) -> torch.Tensor:
    """An independent reading of the documented layout, element by element (Python ints):
    byte i of low word w and nibble i of code word w belong to element 8w + i."""
    n = p.row_numel
    low = p.low[expert].view(torch.uint8).tolist()
    nibbles = p.codes[expert].view(torch.uint8).tolist()
    escapes = iter(p.escapes[expert].tolist())
    out = []
    for i in range(n):
        code = (nibbles[i // 2] >> (4 * (i % 2))) & 15
        exponent = next(escapes) if code == ESCAPE else p.base + code
        b = low[i]
        bits = ((b >> 7) << 15) | (exponent << 7) | (b & 0x7F)
        out.append(bits - 65536 if bits >= 32768 else bits)
    return torch.tensor(out, dtype=torch.int16)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.reshape(-1).view(torch.int16), b.reshape(-1).view(torch.int16))


def test_packing_is_lossless_with_special_values():
    t = _weights(4, 3 * PACK_BLOCK + 8, seed=1, specials=40)
    t[2, PACK_BLOCK - 3 : PACK_BLOCK + 3] = 0.0  # escapes across a block boundary
    p = pack_experts(t)
    assert p is not None and p.escapes.shape[1] >= 6
    for e in range(4):
        assert _same_bits(p.unpack_row(e), t[e])
        assert _same_bits(unpack_by_the_layout(p, e), t[e])
    # each block's start counts the escapes of the blocks before it
    codes = torch.stack(
        [p.codes[2].view(torch.uint8) & 15, p.codes[2].view(torch.uint8) >> 4], dim=1
    ).reshape(-1)
    escaped = (codes == ESCAPE).to(torch.int32)
    for b in range(p.starts.shape[1]):
        assert int(p.starts[2, b]) == int(escaped[: b * PACK_BLOCK].sum())


@settings(max_examples=25, deadline=None)
@given(
    num_experts=st.integers(1, 5),
    words=st.integers(64, 700),  # rows of >= 512: 30 escapes always fit the 80% bound
    seed=st.integers(0, 2**16),
    specials=st.integers(0, 30),
    scale=st.sampled_from([1e-3, 0.02, 1.0, 300.0]),
)
def test_packing_round_trips(num_experts, words, seed, specials, scale):
    t = _weights(num_experts, 8 * words, seed, specials) * scale
    p = pack_experts(t.view(num_experts, 8, words))
    assert p is not None  # (where packing declines: test_packing_declines_...)
    assert p.shape == (num_experts, 8, words) and p.dtype == torch.bfloat16
    for e in range(num_experts):
        assert _same_bits(p.unpack_row(e), t[e])


def test_packing_declines_what_it_cannot_pack_or_save():
    assert pack_experts(torch.randn(3, 64)) is None  # fp32
    assert pack_experts(torch.randn(3, 12).to(torch.bfloat16)) is None  # 12 % 8
    wide = torch.logspace(-30, 30, 3 * 4096, base=2.0).to(torch.bfloat16).view(3, 4096)
    assert pack_experts(wide) is None  # 60 octaves: most exponents escape
    mixed = pack_layer({"w13": _weights(2, 64, 0), "scales": torch.ones(2, 4)})
    assert isinstance(mixed["w13"], PackedExperts) and isinstance(mixed["scales"], torch.Tensor)


def test_packed_size_and_window():
    t = _weights(8, 768 * 64, seed=3)  # N(0, 0.02), as dummy and trained weights
    p = pack_experts(t)
    ratio = p.nbytes / (t.numel() * 2)
    assert 0.75 <= ratio < 0.76, ratio
    exponents = (t.view(torch.int16).to(torch.int32) >> 7) & 0xFF
    inside = ((exponents >= p.base) & (exponents < p.base + ESCAPE)).float().mean()
    assert inside > 0.999 and p.base == densest_window(t)
    full = torch.bincount(exponents.reshape(-1), minlength=256).unfold(0, 15, 1).sum(dim=1)
    assert p.base == int(full.argmax())  # the sampled histogram picks the full one's window
    assert stored_row_bytes(p) == p.nbytes // 8 < unpacked_row_bytes(p) == 768 * 64 * 2


# --- through the engine ----------------------------------------------------------------------

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
BUDGET = 16  # a step's tokens: the 40-token prompt runs as a prompt pass (staging)
PROMPTS = prompts(3, seed=1) + [prompts(4, seed=2)[3] + prompts(4, seed=3)[1][:10]]


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral", "qwen3_5_moe", "qwen2_moe"])
def checkpoint(request, tmp_path_factory):
    arch = request.param
    key = "num_local_experts" if arch == "mixtral" else "num_experts"
    model = make_hf_model(arch, seed=3, num_hidden_layers=4, **{key: 16})
    return write_checkpoint(model, tmp_path_factory.mktemp(arch))


def _run(path, **kw):
    """Greedy tokens, and the offload stats (None without offload) with the store's bytes."""
    llm = LLM(str(path), device="cpu", dtype="bfloat16", max_num_batched_tokens=BUDGET, **kw)
    tokens = [r.token_ids for r in llm.generate(PROMPTS, GREEDY)]
    stats = llm.offload_stats()
    if stats is not None:
        stats["store_bytes"] = llm.engine.offload_manager.store.nbytes
    return tokens, stats


def test_compressed_offload_keeps_output(checkpoint):
    base, _ = _run(checkpoint)
    for fraction in (0.1, 0.25, 0.5):
        # prefetch off in both, so that their misses and bytes compare one to one
        plain, plain_stats = _run(checkpoint, moe_offload=fraction, moe_prefetch=0)
        packed, stats = _run(
            checkpoint, moe_offload=fraction, moe_offload_compress=True, moe_prefetch=0
        )
        assert "prefetch" not in stats
        assert packed == base == plain, f"output changed at {fraction}"
        assert stats["compressed"] and not plain_stats["compressed"]
        assert (stats["misses"], stats["hits"]) == (plain_stats["misses"], plain_stats["hits"])
        assert stats["staging_copies"] > 0 and stats["overflow_misses"] > 0
        ratio = stats["bytes_moved"] / plain_stats["bytes_moved"]
        assert 0.7 < ratio < 0.8, ratio
        store_ratio = stats["store_bytes"] / plain_stats["store_bytes"]
        assert 0.7 < store_ratio < 0.8, store_ratio


def test_compressed_offload_with_lru_and_prefetch(checkpoint):
    base, _ = _run(checkpoint)
    for kw in ({"moe_offload_policy": "lru"}, {"moe_prefetch": 1, "moe_prefetch_margin": 0.0}):
        out, stats = _run(checkpoint, moe_offload=0.25, moe_offload_compress=True, **kw)
        assert out == base, kw
        if "moe_prefetch" in kw:
            pf = stats["prefetch"]
            assert pf["prefetched"] > 0
            assert stats["bytes_moved"] == (
                stats["bytes_copied"] + stats["staging_bytes"] + pf["prefetched_bytes"]
            )


def test_compress_without_bf16_experts_says_so(checkpoint, caplog):
    """Nothing is accepted and ignored in silence: with fp32 experts nothing packs, and the
    log says so; the output is that of no offload."""
    llm = LLM(str(checkpoint), device="cpu", dtype="float32", max_num_batched_tokens=BUDGET)
    base = [r.token_ids for r in llm.generate(PROMPTS[:1], GREEDY)]
    with caplog.at_level("WARNING", logger="xinfer"):
        llm = LLM(
            str(checkpoint),
            device="cpu",
            dtype="float32",
            max_num_batched_tokens=BUDGET,
            moe_offload=0.25,
            moe_offload_compress=True,
        )
    assert "--moe-offload-compress has no effect here" in caplog.text and "float32" in caplog.text
    assert [r.token_ids for r in llm.generate(PROMPTS[:1], GREEDY)] == base
    assert not llm.offload_stats()["compressed"]


def test_plain_bf16_offload_names_the_packing(checkpoint, caplog):
    """bf16 experts offloaded plain: the start-up log points at --moe-offload-compress; with
    it on, or with experts that would not pack (fp32), it does not."""
    kw = dict(device="cpu", max_num_batched_tokens=BUDGET, moe_offload=0.25)
    hint = "--moe-offload-compress keeps them packed"
    for dtype, compress, shown in (("bfloat16", False, True), ("bfloat16", True, False),
                                   ("float32", False, False)):  # fmt: skip
        caplog.clear()
        with caplog.at_level("INFO", logger="xinfer"):
            LLM(str(checkpoint), dtype=dtype, moe_offload_compress=compress, **kw)
        assert (hint in caplog.text) == shown, (dtype, compress)


class _Layer:
    def __init__(self, tensors):
        self.expert_tensors = tensors


def test_host_sets_make_the_next_layers_planes_while_one_packs(monkeypatch):
    """offload/setup.py host_sets: each layer's packing equals pack_layer's alone, and the
    plane buffers of layer k + 1 are under way on the helper thread before layer k is stored (a
    layer that does not pack, fp32, passes through)."""
    import threading

    from xinfer.offload import setup
    from xinfer.offload.host_store import HostExpertStore

    sources = [
        {"w13": _weights(4, 2 * 64, seed=k), "w2": _weights(4, 64, seed=10 + k)} for k in range(3)
    ]
    sources.append({"w13": torch.randn(4, 16), "w2": torch.randn(4, 8)})  # fp32: no planes
    expected = [pack_layer({n: t.clone() for n, t in s.items()}) for s in sources]
    started = [threading.Event() for _ in sources]
    threads = []
    made = setup.layer_plane_buffers

    def recording_buffers(tensors):
        k = next(i for i, s in enumerate(sources) if s["w2"] is tensors["w2"])
        threads.append(threading.current_thread().name)
        started[k].set()
        return made(tensors)

    store = HostExpertStore(torch.device("cpu"))
    stored_layer = store.add_layer

    def recording_add(tensors):
        k = len(store.layers)
        # layer k + 1's buffers are under way before layer k is stored (no look-ahead: the
        # wait runs out)
        assert k + 1 == len(sources) or started[k + 1].wait(10), k
        return stored_layer(tensors)

    monkeypatch.setattr(setup, "layer_plane_buffers", recording_buffers)
    monkeypatch.setattr(store, "add_layer", recording_add)
    layers = [_Layer(dict(s)) for s in sources]
    got = list(setup.host_sets(layers, True, torch.device("cpu"), store))
    for k, (g, e) in enumerate(zip(got, expected)):
        assert set(g) == set(e)
        for name in e:
            if isinstance(e[name], PackedExperts):
                assert isinstance(g[name], PackedExperts), (k, name)
                for plane in ("low", "codes", "escapes", "starts"):
                    assert torch.equal(getattr(g[name], plane), getattr(e[name], plane))
            else:
                assert k == 3 and torch.equal(g[name], e[name])
    assert len(threads) == 4 and all(name.startswith("xinfer-planes") for name in threads)
    assert all(layer.expert_tensors == {} for layer in layers)
