"""A prompt pass's routed-expert calls joined across its chunks (runner/expert_merge.py): which
chunks join (equal keys, the joined call's key unchanged, a size cap), that a joined pass
gives the chunked path's tokens resident and offloaded (on CPU the twin has no key: the
tests give it one), and where joining is refused (tensor-parallel hooks, an offload layer on
its lookup path, GEMV-sized calls, the CPU twin)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_hf_model, prompts, write_checkpoint

from xinfer import LLM, SamplingParams
from xinfer.layers.moe import FusedMoE
from xinfer.quant.unquantized import Unquantized
from xinfer.runner import expert_merge


def _tile_key(top_k: int):
    """The shape of moe_launch's choice: GEMV up to 64 pairs (never joined), then three
    grouped tiles by pair count."""

    def key(tokens: int):
        pairs = tokens * top_k
        if pairs <= 64:
            return None
        return "small" if pairs <= 1024 else "mid" if pairs < 16384 else "large"

    return key


@pytest.mark.parametrize(
    "sizes, top_k, max_tokens, groups",
    [
        ([2048] * 4 + [100], 8, 9362, [[0, 1, 2, 3], [4]]),  # the short last chunk: its own tile
        ([2048] * 6, 8, 9362, [[0, 1, 2, 3], [4, 5]]),  # the size cap
        ([2048] * 4, 2, 10**9, [[0, 1, 2], [3]]),  # joined, 4 chunks would change the tile
        ([512, 512, 300], 4, 10**9, [[0, 1, 2]]),  # all "mid": the short last one joins
        ([8, 8, 8], 8, 10**9, [[0], [1], [2]]),  # GEMV-sized: never
        ([2048], 8, 10**9, [[0]]),
    ],
)
def test_join_groups(sizes, top_k, max_tokens, groups):
    assert expert_merge.join_groups(sizes, _tile_key(top_k), max_tokens) == groups


def _generate(path, prompt, layered: bool, frac=None) -> tuple[list[int], LLM]:
    llm = LLM(str(path), device="cpu", moe_offload=frac, max_num_batched_tokens=16)
    llm.engine.scheduler.layered_prompts = layered
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    return llm.generate(prompt, params)[0].token_ids, llm


def _count_run_widths(monkeypatch) -> list[int]:
    """The token count of every `FusedMoE.run` call from now on (the list fills as they run)."""
    widths: list[int] = []
    run = FusedMoE.run

    def counting_run(self, x, weights, ids):
        widths.append(x.shape[0])
        return run(self, x, weights, ids)

    monkeypatch.setattr(FusedMoE, "run", counting_run)
    return widths


@pytest.mark.parametrize("frac", [None, 0.25])
def test_joined_pass_equals_chunked_path(tmp_path, monkeypatch, frac):
    """A 70-token prompt, 16-token chunks (4 full and a short one): with a key for every
    call, each MoE layer of the pass runs its experts once; the tokens are the chunked
    path's (float32 on CPU, where joining is otherwise off)."""
    path = write_checkpoint(make_hf_model("olmoe", seed=2, num_experts=16), tmp_path)
    prompt = (prompts(4, seed=6)[3] * 3)[:70]
    chunked, _ = _generate(path, prompt, layered=False, frac=frac)

    monkeypatch.setattr(Unquantized, "moe_merge_key", lambda self, pairs, x: "one tile")
    widths = _count_run_widths(monkeypatch)
    joined, llm = _generate(path, prompt, layered=True, frac=frac)
    assert joined == chunked
    layers = len(llm.engine.model.moe_layers())
    prompt_calls = [w for w in widths if w > 1]  # the decode steps' calls are one token wide
    assert prompt_calls.count(70) == layers  # the pass: one call per layer over all chunks


def test_no_key_on_the_cpu_twin_and_for_gemv_sized_calls():
    fmt = Unquantized(torch.float32)
    assert fmt.moe_merge_key(4096, torch.zeros(2, 2)) is None  # CPU: the reference twin


def test_quantized_keys_follow_the_prefill_path(monkeypatch):
    """FP8 / INT4 / NVFP4 / GGUF block types / ISQ: a key only from PREFILL_MIN_PAIRS pairs.
    Formats that dequantize their experts there (NVFP4, GGUF, ISQ) share the dequantized
    route's key, which follows the grouped tiles; FP8 and INT4 stay in registers
    (`dequant_experts_in_prefill`), one key of their tiles, another than the dequantized
    route's. The CPU twin: none."""
    from xinfer import kernels
    from xinfer.kernels import gguf_launch, quant_launch
    from xinfer.quant.fp8 import Fp8Block
    from xinfer.quant.gguf_formats import GGUFFormat
    from xinfer.quant.gptq import GptqInt4
    from xinfer.quant.isq import IsqFormat
    from xinfer.quant.nvfp4 import Nvfp4

    x = torch.zeros(2, 256, dtype=torch.bfloat16)  # ISQ picks its block type by row length
    registers = (Fp8Block(128, 128), GptqInt4(group_size=128, has_zero=False))
    formats = {
        quant_launch.PREFILL_MIN_PAIRS: (*registers, Nvfp4()),
        gguf_launch.PREFILL_MIN_PAIRS: (GGUFFormat("Q4_K"), GGUFFormat("Q6_K"), IsqFormat("Q4_K")),
    }
    every = [f for group in formats.values() for f in group]
    assert all(f.moe_merge_key(1 << 16, x) is None for f in every)  # CPU tensors
    monkeypatch.setattr(kernels, "use_triton", lambda t: True)
    for low, group in formats.items():
        for fmt in group:
            assert fmt.moe_merge_key(low - 1, x) is None  # the decode-sized kernels
            assert fmt.moe_merge_key(low + 8, x) == fmt.moe_merge_key(2 * low, x) is not None
            if fmt not in registers:  # the dequantized route's grouped tiles by size
                assert fmt.moe_merge_key(2048 * 8, x) != fmt.moe_merge_key(1024 * 8, x)
    dequantized = [f for f in every if f not in registers]
    assert len({f.moe_merge_key(8192, x) for f in dequantized}) == 1  # one path for all
    # the in-register keys carry each format's tiles (`moe_prefill_tiles`: INT4's 128 rows)
    in_registers = {f.moe_merge_key(8192, x) for f in registers}
    assert len(in_registers) == len(registers)
    assert in_registers.isdisjoint({dequantized[0].moe_merge_key(8192, x)})
    gptq_tiles = registers[1].moe_merge_key(8192, x)[1]
    assert (gptq_tiles.block_m, gptq_tiles.num_warps) == (128, 8)


def test_prefill_sized_expert_calls_dequantize_where_the_format_asks():
    from xinfer.kernels import quant_launch as ql
    from xinfer.quant.awq import AwqInt4
    from xinfer.quant.compressed_tensors import PackQuantizedInt4
    from xinfer.quant.fp8 import Fp8Block, Fp8Scaled
    from xinfer.quant.gptq import GptqInt4
    from xinfer.quant.nvfp4 import Nvfp4

    low = ql.PREFILL_MIN_PAIRS
    in_registers = (Fp8Block(), Fp8Scaled(), GptqInt4(), AwqInt4(),
                    PackQuantizedInt4(32, True, torch.bfloat16))  # fmt: skip
    for fmt in in_registers:
        assert not ql.dequantizes_experts(fmt, 1 << 20), fmt
    assert ql.dequantizes_experts(Nvfp4(), low) and not ql.dequantizes_experts(Nvfp4(), low - 1)


def test_mixed_w2_block_type_joins_where_both_formats_agree(monkeypatch):
    """GGUF files often store w2 in another block type (Q4_K_M: Q6_K for some layers): the
    layer's key is its formats' common key, none where they differ."""
    from xinfer import kernels
    from xinfer.kernels import gguf_launch
    from xinfer.quant.experts import ExpertWeights
    from xinfer.quant.fp8 import Fp8Block
    from xinfer.quant.gguf_formats import GGUFFormat

    x = torch.zeros(2, 2, dtype=torch.bfloat16)
    pairs = 4 * gguf_launch.PREFILL_MIN_PAIRS
    monkeypatch.setattr(kernels, "use_triton", lambda t: True)
    mixed = ExpertWeights(GGUFFormat("Q4_K"), 256, 256, GGUFFormat("Q6_K"))
    assert kernels.moe_merge_key(mixed, pairs, x) == GGUFFormat("Q4_K").moe_merge_key(pairs, x)
    assert kernels.moe_merge_key(mixed, 8, x) is None
    monkeypatch.setattr(Fp8Block, "moe_merge_key", lambda self, n, h: ("other", n))
    odd = ExpertWeights(GGUFFormat("Q4_K"), 256, 256, Fp8Block(128, 128))
    assert kernels.moe_merge_key(odd, pairs, x) is None


def test_refused_under_tensor_parallel_hooks(tmp_path):
    path = write_checkpoint(make_hf_model("olmoe", seed=2, num_experts=16), tmp_path)
    llm = LLM(str(path), device="cpu")
    layer = llm.engine.model.model.layers[0]
    assert expert_merge.mergeable_block(layer) is layer.mlp
    layer.mlp.register_forward_hook(lambda module, args, out: out)  # as parallel/model.py does
    assert expert_merge.mergeable_block(layer) is None


def test_offload_lookup_path_takes_no_joined_call(tmp_path, monkeypatch):
    """An offloaded layer outside a pass's streaming (its overflow rows are sized for one
    step's tokens) gives no key, whatever its format would say."""
    monkeypatch.setattr(Unquantized, "moe_merge_key", lambda self, pairs, x: "one tile")
    path = write_checkpoint(make_hf_model("olmoe", seed=2, num_experts=16), tmp_path)
    llm = LLM(str(path), device="cpu", moe_offload=0.25)
    moe = llm.engine.model.moe_layers()[0]
    x = torch.zeros(4, moe.hidden_size)
    assert moe.executor.streamed is None and moe.merge_key(32, x) is None
    moe.executor.streamed = (torch.zeros(16, dtype=torch.int32), {})
    assert moe.merge_key(32, x) == "one tile"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "chunk, top_k, count", [(100, 4, 2), (512, 4, 3), (300, 8, 2), (2048, 8, 4)]
)
def test_joined_call_gives_each_row_its_bits_on_cuda(chunk, top_k, count):
    """The key's promise on the GPU kernels, for each grouped tile (small, mid, large): one
    call over `count` chunks == the chunks' own calls, bit for bit."""
    from xinfer import kernels

    dev, dt = torch.device("cuda", 0), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(chunk + top_k)
    num_experts, hidden, inter = 64, 512, 256
    w13 = torch.randn(num_experts, 2 * inter, hidden, device=dev, generator=g).to(dt) / 16
    w2 = torch.randn(num_experts, hidden, inter, device=dev, generator=g).to(dt) / 16
    xs = [torch.randn(chunk, hidden, device=dev, generator=g).to(dt) for _ in range(count)]
    logits = [torch.randn(chunk, num_experts, device=dev, generator=g) for _ in range(count)]
    choices = [kernels.route_topk(lg, top_k, True) for lg in logits]
    fmt = Unquantized(dt)
    assert fmt.moe_merge_key(chunk * top_k, xs[0]) is not None
    assert fmt.moe_merge_key(chunk * top_k, xs[0]) == fmt.moe_merge_key(
        count * chunk * top_k, xs[0]
    )
    own = [kernels.fused_moe(x, i, w, w13, w2) for x, (w, i) in zip(xs, choices)]
    joined = kernels.fused_moe(
        torch.cat(xs), torch.cat([i for _, i in choices]), torch.cat([w for w, _ in choices]),
        w13, w2,
    )  # fmt: skip
    assert torch.equal(joined.view(torch.int16), torch.cat(own).view(torch.int16))


@pytest.mark.gpu
def test_prefill_chunks_take_the_large_grouped_tile_on_cuda():
    """A 2,048-token chunk at top-8 takes the 128 x 128 tile where the device allows its
    shared memory (the H200: 227 KiB), not the fallback a missing device property would
    give silently."""
    from xinfer.kernels import moe_launch

    dev = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(dev)
    cfg = moe_launch.grouped_config(2048 * 8, torch.bfloat16, dev)
    assert props.shared_memory_per_block_optin == moe_launch._shared_memory(dev)
    want = 128 if props.shared_memory_per_block_optin >= moe_launch.LARGE_TILE_SHARED else 64
    assert cfg.block_m == want


@pytest.mark.gpu
def test_engine_pass_joins_its_expert_calls_on_cuda(tmp_path, monkeypatch):
    """A 2,400-token prompt, 1,024-token chunks, bf16 on the GPU: the two full chunks' expert
    calls run as one 2,048-token call (the short last chunk keeps its smaller tile), and the
    greedy tokens are the chunked path's."""
    path = write_checkpoint(make_hf_model("qwen3_moe", max_position_embeddings=4096), tmp_path)
    prompt = (prompts(4, seed=3)[3] * 200)[:2400]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    widths = _count_run_widths(monkeypatch)
    outs, joined_calls = [], []
    for layered in (False, True):
        llm = LLM(str(path), device="cuda:0", dtype="bfloat16", max_num_batched_tokens=1024,
                  max_model_len=4096)  # fmt: skip
        llm.engine.scheduler.layered_prompts = layered
        widths.clear()
        outs.append(llm.generate(prompt, params)[0].token_ids)
        joined_calls.append(widths.count(2048))
        num_moe = len(llm.engine.model.moe_layers())
        del llm
    assert joined_calls == [0, num_moe] and outs[0] == outs[1]
