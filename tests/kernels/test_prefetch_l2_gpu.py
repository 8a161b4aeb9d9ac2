"""The L2 weight prefetch of the dense decode linears (`kernels/pdl.py` PREFETCH_WEIGHTS:
each program asks L2 for its weight rows, and the scales where they qualify, before its PDL
wait; `triton/pdl.py` `prefetch_rows_l2`) on the GPU: the prefetch only moves bytes into L2,
so every output must keep its bits. For each family that takes it — the bf16 skinny GEMM,
the router GEMV with its top-k, GGUF Q4_K (word tile, byte tile, one-row kernel), FP8 block,
GPTQ int4 and NVFP4 decode linears — with PDL on, behind a norm kernel it waits for: 1 and
8 rows, split and unsplit K, outputs of 20 launches in a row and of a CUDA graph's replays
bit-equal with PREFETCH_WEIGHTS on and off; and the tiny MoE engine's greedy tokens (its
router) equal. Each case asserts its weights qualify (`pdl.prefetch_options`), so the
switch really compiles the prefetch in. All `gpu`: skipped without CUDA (and without sm_90,
where PDL, so the prefetch, is not offered). The instruction and its place before the wait:
test_prefetch_l2_compile.py; its byte ranges: test_prefetch_l2_interpret.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cuda_graphs import capture_after_warmup

pytestmark = pytest.mark.gpu
N, K = 2048, 2048


@pytest.fixture
def switch(monkeypatch):
    """run(call, on): `call()` with PDL on and PREFETCH_WEIGHTS `on` (both read at launch and
    capture time)."""
    pytest.importorskip("triton")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the prefetch comes with PDL: it needs an sm_90+ GPU")
    monkeypatch.delenv("XINFER_DISABLE_TRITON", raising=False)
    from xinfer.kernels import pdl

    monkeypatch.setattr(pdl, "ENABLED", True)
    monkeypatch.setenv("XINFER_PDL", "1")  # (an engine's start sets the flags from these)

    def run(call, on: bool):
        with monkeypatch.context() as patch:
            patch.setattr(pdl, "PREFETCH_WEIGHTS", on)
            patch.setenv("XINFER_PDL_PREFETCH", "1" if on else "0")
            return call()

    return run


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _randn(*shape, seed: int, scale: float = 1.0, dtype=torch.bfloat16) -> torch.Tensor:
    return (torch.randn(*shape, generator=_gen(seed), device="cuda") * scale).to(dtype)


def _qualifies(*tensors: torch.Tensor, key: str = "PREFETCH_L2") -> None:
    """The switch's options would prefetch these (PDL given, 16-byte rows)."""
    from xinfer.kernels import pdl

    saved, pdl.PREFETCH_WEIGHTS = pdl.PREFETCH_WEIGHTS, True
    try:
        for t in tensors:
            assert pdl.prefetch_options(t, key) == {key: True}, (t.shape, t.stride(), t.dtype)
    finally:
        pdl.PREFETCH_WEIGHTS = saved


def _behind_a_norm(linear, rows: int, k: int, seed: int, dtype=torch.bfloat16):
    """A call: the rms norm of fixed rows (a PDL kernel the linear waits for), then
    `linear(h)`; returns its outputs as a list."""
    from xinfer import kernels

    x = _randn(rows, k, seed=seed, dtype=dtype)
    norm_w = _randn(k, seed=seed + 1, scale=0.1, dtype=dtype) + 1

    def call():
        h = kernels.rms_norm(x, norm_w, 1e-6)
        out = linear(h)
        return [h, *(out if isinstance(out, tuple) else (out,))]

    return call


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() and t.element_size() in (2, 4):
        return t.view(torch.int16 if t.element_size() == 2 else torch.int32)
    return t


def _assert_same(got, want, where: str) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        same = torch.equal(_bits(a), _bits(b))
        assert same, f"{where}: output {i} differs ({(_bits(a) != _bits(b)).sum().item()} values)"


def _check_eager_and_graph(switch, call) -> None:
    """20 launches in a row and 20 replays of a CUDA graph, prefetch on, against one call
    with it off, bit for bit."""
    want = [t.clone() for t in switch(call, on=False)]
    runs = [[t.clone() for t in switch(call, on=True)] for _ in range(20)]
    torch.cuda.synchronize()
    for i, got in enumerate(runs):
        _assert_same(got, want, f"launch {i}")
    graph, outs = switch(lambda: capture_after_warmup(call), on=True)
    for i in range(20):
        graph.replay()
        torch.cuda.synchronize()
        _assert_same(outs, want, f"replay {i}")


ROWS = [1, 8]
SPLITS = ["split", "unsplit"]


# --- the bf16 skinny GEMM and the router -------------------------------------------------


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("rows", ROWS)
def test_gemv(switch, rows, split) -> None:
    from xinfer.kernels import gemv_launch

    k = 4096 if split == "split" else 512  # the table's o_proj (split 4) / (2048, 512) tiles
    cfg = gemv_launch.select(N, k, rows, torch.bfloat16)
    assert cfg is not None and (cfg.split_k > 1) == (split == "split"), cfg
    w = _randn(N, k, seed=2, scale=k**-0.5)
    _qualifies(w)
    _check_eager_and_graph(switch, _behind_a_norm(lambda h: gemv_launch.linear(h, w), rows, k, 3))


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("rows", ROWS)
def test_router(switch, rows, split, monkeypatch) -> None:
    from xinfer.kernels import gemv_launch, router_launch

    experts, k = 128, 2048
    if split == "unsplit":  # the table's router tiles split K in 8
        tiles = gemv_launch.GemvConfig(block_n=16, block_k=256, num_stages=4)
        monkeypatch.setattr(router_launch, "config", lambda *args: tiles)
    w = _randn(experts, k, seed=4, scale=k**-0.5)
    _qualifies(w)
    route = lambda h: router_launch.router_topk(h, w, 8, True)
    _check_eager_and_graph(switch, _behind_a_norm(route, rows, k, 5))


# --- GGUF Q4_K ----------------------------------------------------------------------------


@pytest.mark.parametrize("tile", ["words", "bytes", "one-row"])
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("rows", ROWS)
def test_gguf_q4k(switch, rows, split, tile) -> None:
    import gguf_files as gf

    from xinfer.kernels import gguf_launch
    from xinfer.quant.gguf_blocks import BLOCK_TYPES

    n = 1024  # every tile splits K (2048 rows of the byte tile would not: 512 programs)
    btype = BLOCK_TYPES["Q4_K"]
    w = gf.random_block_rows("Q4_K", n, K, seed=6, device="cuda")
    assert gguf_launch.q4k_words(w, btype, K)
    if tile == "one-row":
        t = gguf_launch.GGUFTiles(1, 8, 8, num_warps=4)
    else:
        t = gguf_launch.linear_tiles(rows, torch.bfloat16, btype, n, words=tile == "words")
    assert t.words == (tile == "words") and t.block_m in (1, 4), t
    if split == "unsplit":
        t = dataclasses.replace(t, split_programs=0)
    else:
        assert gguf_launch.decode_split(rows, -(-n // t.block_n), K, t)[1] > 1, t
    _qualifies(w)
    linear = lambda h: gguf_launch.linear(h, w, btype, None, n, K, t)
    _check_eager_and_graph(switch, _behind_a_norm(linear, rows, K, 7))


# --- FP8 block, GPTQ int4, NVFP4 --------------------------------------------------------


def _formats():
    from xinfer.quant.fp8 import Fp8Block
    from xinfer.quant.gptq import GptqInt4
    from xinfer.quant.nvfp4 import Nvfp4

    return {
        "fp8-block128": Fp8Block(128, 128),
        "gptq-g128": GptqInt4(group_size=128, has_zero=False),
        "nvfp4": Nvfp4(),
    }


@pytest.mark.parametrize("name", ["fp8-block128", "gptq-g128", "nvfp4"])
@pytest.mark.parametrize("tile", ["default", "one-row"])
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("rows", ROWS)
def test_quant_linear(switch, name, rows, split, tile) -> None:
    """`default`: the format's decode tile (FP8's one-row kernel at one row, else the four-row
    kernel); `one-row`: the one-row kernel on its tile."""
    from quant_weights import random_weights

    from xinfer.kernels import gemv_launch, quant_launch

    fmt = _formats()[name]
    tensors = random_weights(fmt, N, K, seed=8, device="cuda")
    kw = fmt.kernel_weights(tensors, K)
    tiles = quant_launch.linear_tiles(rows, torch.bfloat16, kw, K, fmt)
    assert tiles.block_m in (1, 4), tiles  # the GEMV forms
    if tile == "one-row":
        tiles = dataclasses.replace(tiles, block_m=1)
    if split == "unsplit":
        tiles = dataclasses.replace(tiles, split_programs=0)
    else:
        n_tiles = -(-N // tiles.block_n)
        assert gemv_launch.decode_split(rows, n_tiles, K, tiles.block_k)[1] > 1, tiles
    _qualifies(kw.w)
    _qualifies(kw.s, key="PREFETCH_S")
    linear = lambda h: quant_launch.linear(h, fmt, tensors, None, N, K, tiles=tiles)
    _check_eager_and_graph(switch, _behind_a_norm(linear, rows, K, 9))


# --- an engine ----------------------------------------------------------------------------


def test_engine_greedy_with_prefetch_equals_without(switch, tmp_path) -> None:
    """The tiny MoE model in CUDA graphs (its router on the one-launch top-k): the same
    tokens. (An engine sets the switches from XINFER_PDL* when it starts.)"""
    from tiny_models import make_hf_model, prompts, write_checkpoint

    from xinfer import LLM, SamplingParams

    path = str(write_checkpoint(make_hf_model("qwen3_moe"), tmp_path / "ckpt"))
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    def tokens():
        from xinfer.kernels import pdl

        llm = LLM(path, device="cuda:0", dtype="bfloat16", num_kv_blocks=64)
        assert pdl.ENABLED  # (the start set the flags from the switch's variables)
        return pdl.PREFETCH_WEIGHTS, [r.token_ids for r in llm.generate(prompts(3), params)]

    (on, with_it), (off, without) = switch(tokens, on=True), switch(tokens, on=False)
    assert on and not off
    assert with_it == without
