"""Offload options: parsing and validation (flag wins over the environment), slot sizing for
fractions and `auto`, the host-RAM check, profile mode, and the manager's API."""

from __future__ import annotations

import pytest
import torch
from tiny_models import prompts

from xinfer import LLM, SamplingParams, UserError
from xinfer.config import OffloadConfig
from xinfer.llm import offload_from_env
from xinfer.offload import host_store
from xinfer.offload.sizing import (
    GIB,
    LayerShape,
    SlotPlan,
    auto_reserve_bytes,
    device_bytes_for,
    plan_slots,
    slots_for_fraction,
)

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("value", ["1.5", "-0.1", "0", "abc", "0.2x", "nan"])
def test_bad_fraction_is_a_clear_error(value, monkeypatch):
    with pytest.raises(UserError, match=r"MoE offload.*\(0, 1\]"):
        OffloadConfig.parse(value)
    monkeypatch.setenv("XINFER_MOE_OFFLOAD", value)
    with pytest.raises(UserError, match="MoE offload"):
        offload_from_env()


def test_bad_reserve_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("XINFER_MOE_OFFLOAD", "auto")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_RESERVE_GB", "-1")
    with pytest.raises(UserError, match="reserve must be >= 0"):
        offload_from_env()
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_RESERVE_GB", "lots")
    with pytest.raises(UserError, match="XINFER_MOE_OFFLOAD_RESERVE_GB must be a number"):
        offload_from_env()


def test_good_values_parse(monkeypatch):
    assert not OffloadConfig.parse(None).is_enabled
    assert OffloadConfig.parse(" AUTO ").is_auto
    assert OffloadConfig.parse("1").fraction == 1.0
    monkeypatch.setenv("XINFER_MOE_OFFLOAD", "0.25")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_RESERVE_GB", "4")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_PROFILE", "1")
    cfg = offload_from_env()
    assert (cfg.fraction, cfg.reserve_gb, cfg.is_profile) == (0.25, 4.0, True)
    assert offload_from_env(moe_offload="auto", reserve_gb=1.0).is_auto  # flag wins


def test_llm_rejects_bad_env_and_flag_wins(ckpt, monkeypatch):
    monkeypatch.setenv("XINFER_MOE_OFFLOAD", "1.5")
    with pytest.raises(UserError, match=r"\(0, 1\]"):
        LLM(ckpt, device="cpu")
    llm = LLM(ckpt, device="cpu", moe_offload=0.5)  # the flag wins over the bad variable
    assert llm.offload_stats()["slots_per_layer"] == [4, 4, 4]


def test_slots_for_fraction():
    assert slots_for_fraction(0.1, 8, 2) == 2  # at least top-k
    assert slots_for_fraction(0.3, 10, 1) == 3  # 0.3 * 10 is 3.0000000000000004
    assert slots_for_fraction(0.2, 128, 8) == 26  # rounded up
    assert slots_for_fraction(1.0, 128, 8) == 128


def test_plan_slots_auto_and_budget():
    layers = [LayerShape(128, 8, 10_000_000)] * 48  # 0.48 GB per slot across the layers
    auto = OffloadConfig(is_auto=True, reserve_gb=2.5)
    regions = 2 * (128 - 40) * 10_000_000  # overflow + 2nd streaming buffer: 2 (E - S) rows
    assert device_bytes_for(layers, 40) == 40 * 480_000_000 + regions
    budget = int(2.5 * GIB) + regions + 40 * 480_000_000 + 1000
    assert plan_slots(layers, auto, budget) == SlotPlan(40, 2)  # 1 buffer: 41, not 1.2x
    assert plan_slots(layers, auto, budget - 2000).slots == 39
    assert plan_slots(layers, auto, None).slots == 128  # unbounded (CPU, no limit)
    assert plan_slots(layers, auto, 10**13).slots == 128  # everything fits
    assert device_bytes_for(layers, 128) == 128 * 480_000_000  # no regions at E slots
    # packed experts: the prompt pass's buffer of 16 experts comes out of the same budget
    packed = OffloadConfig(is_auto=True, reserve_gb=2.5, compress=True)
    assert device_bytes_for(layers, 40, compress=True) == 40 * 480_000_000 + regions + 16e7
    assert plan_slots(layers, packed, budget + 160_000_000).slots == 40
    assert plan_slots(layers, packed, budget).slots == 39
    assert device_bytes_for(layers, 128, compress=True) == 128 * 480_000_000  # nothing streams
    with pytest.raises(UserError, match="cannot fit 8 experts per layer"):
        plan_slots(layers, auto, int(3 * GIB))
    with pytest.raises(UserError, match="lower XINFER_MOE_OFFLOAD"):
        plan_slots(layers, OffloadConfig(fraction=0.5), int(10 * GIB))


def test_auto_on_cpu_with_memory_limit(ckpt):
    full = LLM(ckpt, device="cpu", moe_offload="auto")
    assert full.offload_stats()["slots_per_layer"] == [8, 8, 8]
    with pytest.raises(UserError, match="cannot fit 2 experts per layer"):
        LLM(ckpt, device="cpu", moe_offload="auto", gpu_memory_limit_gb=0.001)
    # Experts of 3 x 64 x 32 x 4 bytes; S slots in 3 layers plus 2 (8 - S) overflow and
    # streaming rows: a budget of 20 expert rows fits S = 4 (4 * 3 + 2 * 4 = 20); with one
    # stream buffer of 8 - S rows S = 6 (6 * 3 + 2 = 20), 1.5x: `auto` takes one buffer.
    row = 3 * 64 * 32 * 4
    limit = (_dense_bytes(full) + 20 * row + 100) / GIB
    kw = dict(device="cpu", moe_offload="auto", moe_offload_reserve_gb=0.0)
    small = LLM(ckpt, **kw, gpu_memory_limit_gb=limit)
    st = small.offload_stats()
    assert (st["slots_per_layer"], st["stream_buffers"]) == ([6, 6, 6], 1)
    assert st["staging_gb"] == 2 * row / 1e9  # one region of 8 - 6 rows
    two = LLM(ckpt, **kw, gpu_memory_limit_gb=limit, moe_offload_stream_buffers=2)
    st = two.offload_stats()
    assert (st["slots_per_layer"], st["stream_buffers"]) == ([4, 4, 4], 2)
    assert st["staging_gb"] == 2 * 4 * row / 1e9
    assert full.offload_stats()["stream_buffers"] == 0  # every expert resident: none


def _dense_bytes(llm) -> int:
    """What the model holds on the device besides the experts (parameters and buffers)."""
    model = llm.engine.model
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def test_host_ram_check(ckpt, monkeypatch):
    monkeypatch.setattr(host_store, "available_host_bytes", lambda: 512 << 20)
    with pytest.raises(UserError, match="GB of host RAM but only 0.5 GB is available"):
        LLM(ckpt, device="cpu", moe_offload=0.5)
    monkeypatch.setattr(host_store, "available_host_bytes", lambda: None)  # no /proc
    LLM(ckpt, device="cpu", moe_offload=0.5)


def test_manager_api_and_profile(ckpt):
    llm = LLM(ckpt, device="cpu", moe_offload=0.25, moe_offload_profile=True)
    manager = llm.engine.offload_manager
    llm.generate(prompts(2), GREEDY)
    st = llm.offload_stats()
    assert st["profile"]["calls"] > 0 and st["profile"]["copy_s"] >= 0
    assert not manager.is_graph_safe(1)  # profile mode disables graphs
    assert "hit rate" in manager.format_summary(2.0) and "GB/s" in manager.format_summary(2.0)
    pf = st["prefetch"]  # on by default: the line says what it copied
    want = (
        f"prefetch 2 layers ahead copied {pf['prefetched_bytes'] / 1e9:.2f} GB ({pf['prefetched']}"
    )
    assert want in manager.format_summary()
    plain = LLM(ckpt, device="cpu", moe_offload=0.25).engine.offload_manager
    # 2 slots, top-2: wider batches use overflow rows, so every size up to the budget fits
    assert plain.is_graph_safe(1) and plain.is_graph_safe(64)
    assert not plain.is_graph_safe(plain.max_call_tokens + 1)
    assert "profile" not in plain.stats()


def test_stats_keys(ckpt):
    llm = LLM(ckpt, device="cpu", moe_offload=0.5)
    assert llm.offload_stats()["hits"] == 0
    llm.generate(prompts(1), GREEDY)
    st = llm.offload_stats()
    keys = "hits misses hit_rate bytes_copied staging_copies staging_bytes bytes_moved calls"
    keys += " overflow_misses max_call_misses"
    keys += " slots_per_layer num_experts num_layers pinned_gb slot_gb staging_gb device layers"
    assert set(keys.split()) <= set(st)
    assert st["misses"] > 0 and 0.0 <= st["hit_rate"] <= 1.0
    assert st["bytes_copied"] == st["misses"] * 3 * 64 * 32 * 4
    assert sum(layer["hits"] for layer in st["layers"]) == st["hits"]
    assert st["pinned_gb"] == 0.0  # nothing is pinned on CPU
    llm.engine.offload_manager.reset_stats()
    assert llm.offload_stats()["misses"] == 0


def test_offload_unset_means_no_manager(ckpt):
    assert LLM(ckpt, device="cpu").offload_stats() is None


def test_expert_tensors_handed_over(ckpt):
    llm = LLM(ckpt, device="cpu", moe_offload=0.5)
    for layer in llm.engine.model.moe_layers():
        assert layer.expert_tensors == {}
        assert type(layer.executor).__name__ == "OffloadExecutor"
    assert torch.is_tensor(layer.executor.cache.slots["w13"])


def test_fill_option_is_checked():
    assert OffloadConfig.parse("0.2").fill == "kernel"
    assert OffloadConfig.parse("0.2", fill="copy-engine").fill == "copy-engine"
    with pytest.raises(UserError, match="fill must be one of kernel, copy-engine, got 'dma'"):
        OffloadConfig.parse("0.2", fill="dma")
    with pytest.raises(UserError, match="needs MoE expert offload"):
        OffloadConfig.parse(None, fill="copy-engine")


def test_prefetch_fill_option_is_checked(ckpt):
    """`--moe-prefetch-fill`: one of the fills, only with prefetch, and refused on CPU (no
    copy engine) before any weight is read, like the offload fill."""
    cfg = OffloadConfig.parse("0.2", prefetch_distance=1, prefetch_fill="copy-engine")
    assert (cfg.fill, cfg.prefetch_fill) == ("kernel", "copy-engine")
    assert OffloadConfig.parse("0.2", prefetch_distance=1).prefetch_fill is None
    with pytest.raises(UserError, match="prefetch fill must be one of kernel, copy-engine"):
        OffloadConfig.parse("0.2", prefetch_distance=1, prefetch_fill="dma")
    # prefetch is on by default with offload: its fill may be set without a distance
    assert OffloadConfig.parse("0.2", prefetch_fill="copy-engine").prefetch_layers == 2
    with pytest.raises(UserError, match=r"it needs prefetch \(--moe-prefetch other than 0\)"):
        OffloadConfig.parse("0.2", prefetch_distance=0, prefetch_fill="copy-engine")
    with pytest.raises(UserError, match="needs prefetch .* and MoE expert offload"):
        OffloadConfig.parse(None, prefetch_fill="copy-engine")
    with pytest.raises(UserError, match="--moe-prefetch-fill copy-engine cannot run here"):
        LLM(ckpt, device="cpu", moe_offload=0.5, moe_prefetch=1,
            moe_prefetch_fill="copy-engine")  # fmt: skip


def test_prefetch_margin_needs_prefetch(ckpt):
    """--moe-prefetch-margin is refused where nothing prefetches (no offload, or prefetch
    0), never accepted and ignored; with the default prefetch it is the predictor's."""
    with pytest.raises(UserError, match="tune prefetching: they need prefetch .* and MoE"):
        LLM(ckpt, device="cpu", moe_prefetch_margin=0.0)
    with pytest.raises(UserError, match="tune prefetching: they need prefetch"):
        LLM(ckpt, device="cpu", moe_offload=0.5, moe_prefetch=0, moe_prefetch_margin=0.0)
    llm = LLM(ckpt, device="cpu", moe_offload=0.5, moe_prefetch_margin=0.25)
    assert llm.engine.offload_manager.prefetcher.predictor.margin == 0.25
    assert LLM(ckpt, device="cpu", moe_offload=0.5).engine.config.offload.prefetch_cut == 0.5


def test_packed_experts_prefetch_by_default_with_more_fill_programs(ckpt, monkeypatch):
    """With --moe-offload-compress prefetch is on by default as without it, and where the
    experts are packed its fill kernel gets PACKED_PREFETCH_FILL_PROGRAMS (the packed fill
    keeps less in flight a program) unless --moe-prefetch-programs says otherwise; plain
    experts keep 16, also where the option packs nothing."""
    import xinfer.offload.prefetch_setup as setup
    from xinfer.offload.prefetch import (
        PACKED_PREFETCH_FILL_PROGRAMS,
        PREFETCH_FILL_PROGRAMS,
        Prefetcher,
    )

    assert PACKED_PREFETCH_FILL_PROGRAMS > PREFETCH_FILL_PROGRAMS
    assert OffloadConfig.parse("0.5", compress=True).prefetch_layers == 2
    seen = []

    def spy(*args, **kw):
        seen.append(kw["fill_programs"])
        return Prefetcher(*args, **kw)

    monkeypatch.setattr(setup, "Prefetcher", spy)
    bf16 = dict(device="cpu", dtype="bfloat16", moe_offload=0.5)
    packed = LLM(ckpt, **bf16, moe_offload_compress=True)
    assert packed.offload_stats()["compressed"]
    assert packed.engine.offload_manager.prefetcher.distance == 2
    LLM(ckpt, **bf16)
    LLM(ckpt, **bf16, moe_offload_compress=True, moe_prefetch_programs=24)
    # float32 experts do not pack (the option says so and leaves them): a plain fill
    LLM(ckpt, device="cpu", dtype="float32", moe_offload=0.5, moe_offload_compress=True)
    assert seen == [PACKED_PREFETCH_FILL_PROGRAMS, PREFETCH_FILL_PROGRAMS, 24,
                    PREFETCH_FILL_PROGRAMS]  # fmt: skip


def test_prefetch_tuning_options_are_checked(ckpt):
    """`--moe-prefetch-programs` / `--moe-prefetch-issue`: valid values only, only with
    prefetch, programs only for the kernel prefetch fill; honoured by the prefetcher."""
    cfg = OffloadConfig.parse(
        "0.2", prefetch_distance=1, prefetch_programs=64, prefetch_issue="before-lookup"
    )
    assert (cfg.prefetch_programs, cfg.prefetch_issue) == (64, "before-lookup")
    with pytest.raises(UserError, match="issue point must be one of after-fill, before-lookup"):
        OffloadConfig.parse("0.2", prefetch_distance=1, prefetch_issue="early")
    with pytest.raises(UserError, match="prefetch programs must be >= 1"):
        OffloadConfig.parse("0.2", prefetch_distance=1, prefetch_programs=0)
    assert OffloadConfig.parse("0.2", prefetch_programs=64).prefetch_programs == 64  # default on
    with pytest.raises(UserError, match=r"they need prefetch \(--moe-prefetch other than 0\)"):
        OffloadConfig.parse("0.2", prefetch_distance=0, prefetch_programs=64)
    with pytest.raises(UserError, match="they need prefetch"):
        OffloadConfig.parse("0.2", prefetch_distance=0, prefetch_issue="before-lookup")
    with pytest.raises(UserError, match="and MoE expert offload"):
        OffloadConfig.parse(None, prefetch_programs=64)
    with pytest.raises(UserError, match="copy-engine prefetch fill has no programs"):
        OffloadConfig.parse(
            "0.2", prefetch_distance=1, prefetch_fill="copy-engine", prefetch_programs=8
        )
    with pytest.raises(UserError, match="--moe-prefetch-programs must be >= 1"):
        LLM(ckpt, device="cpu", moe_offload=0.5, moe_prefetch=1, moe_prefetch_programs=0)
    llm = LLM(ckpt, device="cpu", moe_offload=0.5, moe_prefetch=1,
              moe_prefetch_issue="before-lookup")  # fmt: skip
    prefetcher = next(x.prefetch[0] for x in llm.engine.offload_manager.executors
                      if getattr(x, "prefetch", None))  # fmt: skip
    assert prefetcher.issue_after_fill is False


def test_copy_engine_fill_is_refused_without_a_gpu(ckpt):
    """On CPU there is no copy engine: one sentence that names the way out, not a fallback
    that silently does something else."""
    with pytest.raises(UserError, match="copy-engine cannot run here: it needs an NVIDIA GPU"):
        LLM(ckpt, device="cpu", moe_offload=0.5, moe_offload_fill="copy-engine")


def test_copy_engine_fill_is_refused_before_any_weight_is_read(ckpt, monkeypatch):
    import xinfer.engine.engine as engine_module

    def not_yet(*args, **kwargs):
        raise AssertionError("weights were read before the option was checked")

    monkeypatch.setattr(engine_module, "build_model", not_yet)
    with pytest.raises(UserError, match="copy-engine cannot run here"):
        LLM(ckpt, device="cpu", moe_offload=0.5, moe_offload_fill="copy-engine")


def test_offload_options_on_a_dense_model_are_ignored_with_a_note(tmp_path, caplog):
    """A model without routed experts runs with `--moe-offload`, prefetch and the fill
    option given (one log line), rather than failing on the options it ignores."""
    import dense_models as dm

    dm.make_dense("llama").save_pretrained(tmp_path)
    with caplog.at_level("INFO", logger="xinfer"):
        llm = LLM(str(tmp_path), device="cpu", moe_offload=0.5, moe_prefetch=1,
                  moe_offload_fill="copy-engine")  # fmt: skip
    assert "MoE offload is ignored" in caplog.text
    assert llm.generate([[3, 4, 5]], GREEDY)[0].token_ids


def test_auto_keeps_what_one_full_sequence_needs():
    """`auto` leaves XINFER_MOE_OFFLOAD_RESERVE_GB free, or more where one --max-model-len
    sequence's KV cache and the workspace need more (a model with a wide KV, e.g. Qwen1.5-MoE's
    full multi-head attention at 8k, needs ~3 GB): the slots shrink instead of start-up failing
    on a KV cache shorter than one sequence."""
    layers = [LayerShape(128, 8, 10_000_000)] * 48
    auto = OffloadConfig(is_auto=True, reserve_gb=2.5)
    regions = 2 * (128 - 40) * 10_000_000
    budget = int(2.5 * GIB) + regions + 40 * 480_000_000 + 1000
    assert auto_reserve_bytes(auto, int(GIB)) == int(2.5 * GIB)  # the reserve is enough
    assert plan_slots(layers, auto, budget, int(GIB)).slots == 40
    more = int(2.5 * GIB) + 3 * 480_000_000  # three slots' worth more than the reserve
    assert auto_reserve_bytes(auto, more) == more
    assert plan_slots(layers, auto, budget, more).slots == 36  # regions: 2 rows per slot less
    with pytest.raises(UserError, match="one --max-model-len sequence's KV cache"):
        plan_slots(layers, auto, budget, budget)


def test_min_free_gpu_bytes_is_what_the_kv_sizing_needs(monkeypatch):
    """The floor `auto` keeps is exactly what `plan_num_blocks` needs for one
    --max-model-len sequence (plus a hybrid model's state): at the floor the cache holds one
    sequence, one block's worth below it it does not."""
    from types import SimpleNamespace

    from xinfer.config import CacheConfig, EngineConfig
    from xinfer.engine import memory

    # Qwen1.5-MoE-A2.7B's KV: 24 layers, K and V of 16 heads x 128, bf16
    cfg = SimpleNamespace(kv_bytes_per_token=lambda dtype: 24 * 2 * 16 * 128 * 2)
    for util, state in [(0.9, 0), (0.75, 12_345_678)]:
        engine = EngineConfig(model="x", cache=CacheConfig(gpu_memory_utilization=util))
        kv_dtype, max_len = torch.bfloat16, 8448
        floor = memory.min_free_gpu_bytes(cfg, engine, kv_dtype, max_len, state)
        blocks_per_seq = -(-max_len // engine.cache.block_size)
        per_block = cfg.kv_bytes_per_token(kv_dtype) * engine.cache.block_size
        cuda = torch.device("cuda")
        for free, enough in [(floor, True), (floor - per_block, False)]:
            monkeypatch.setattr(memory, "usable_gpu_bytes", lambda d, lim, free=free: free)
            blocks = memory.plan_num_blocks(cfg, engine, cuda, kv_dtype, max_len, state)
            assert (blocks >= blocks_per_seq) is enough, (util, state, free)


def test_offload_policy_option():
    """`--moe-offload-policy`: lfu (default) or lru; given without offload it is refused; it
    combines with prefetch (the reservation follows the policy); a bad name is refused."""
    from xinfer.args import EngineArgs

    assert OffloadConfig(fraction=0.2).policy == "lfu"
    assert EngineArgs(moe_offload=0.2).offload_config().policy == "lfu"
    assert EngineArgs(moe_offload=0.2, moe_offload_policy="lru").offload_config().policy == "lru"
    with pytest.raises(UserError, match="policy must be one of lru, lfu"):
        OffloadConfig(fraction=0.2, policy="fifo")
    for policy in ("lfu", "lru"):
        with pytest.raises(UserError, match=f"--moe-offload-policy {policy} applies to MoE"):
            EngineArgs(moe_offload_policy=policy).offload_config()
    both = OffloadConfig(fraction=0.2, policy="lfu", prefetch_distance=1)
    assert (both.policy, both.prefetch_distance) == ("lfu", 1)


def test_offload_policy_from_the_environment(monkeypatch):
    """XINFER_MOE_OFFLOAD_POLICY sets it where the option is not given; the option wins."""
    from xinfer.args import EngineArgs

    monkeypatch.setenv("XINFER_MOE_OFFLOAD_POLICY", "LRU")
    assert EngineArgs(moe_offload=0.2).offload_config().policy == "lru"
    assert EngineArgs(moe_offload=0.2, moe_offload_policy="lfu").offload_config().policy == "lfu"
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_POLICY", "fifo")
    with pytest.raises(UserError, match="policy must be one of lru, lfu"):
        EngineArgs(moe_offload=0.2).offload_config()
    monkeypatch.delenv("XINFER_MOE_OFFLOAD_POLICY")
    assert EngineArgs(moe_offload=0.2).offload_config().policy == "lfu"


def test_offload_settings_from_the_environment_without_offload(monkeypatch, caplog):
    """An offload setting exported for every run (XINFER_MOE_OFFLOAD_POLICY / _COMPRESS /
    _PROFILE) does not break a run without offload: dropped, with a warning naming it. The
    same given as an option is refused."""
    from xinfer.args import EngineArgs

    monkeypatch.setenv("XINFER_MOE_OFFLOAD_POLICY", "lru")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_COMPRESS", "1")
    monkeypatch.setenv("XINFER_MOE_OFFLOAD_PROFILE", "1")
    with caplog.at_level("WARNING", logger="xinfer"):
        cfg = EngineArgs().offload_config()
    assert not cfg.is_enabled and not cfg.compress and not cfg.is_profile
    for name in ("POLICY=lru", "COMPRESS=True", "PROFILE=True"):
        assert f"XINFER_MOE_OFFLOAD_{name} has no effect" in caplog.text, caplog.text
    with_offload = EngineArgs(moe_offload=0.2).offload_config()
    assert (with_offload.policy, with_offload.compress, with_offload.is_profile) == (
        "lru",
        True,
        True,
    )
    for kw, needle in (
        ({"moe_offload_policy": "lfu"}, "--moe-offload-policy lfu applies"),
        ({"moe_offload_compress": True}, "--moe-offload-compress applies"),
        ({"moe_offload_profile": True}, "--moe-offload-profile applies"),
    ):
        with pytest.raises(UserError, match=needle):
            EngineArgs(**kw).offload_config()


def test_compress_option():
    """`--moe-offload-compress` needs offload and the fill kernel (the copy engine cannot
    unpack)."""
    assert OffloadConfig(fraction=0.2, compress=True).compress
    with pytest.raises(UserError, match="copy engine only copies bytes"):
        OffloadConfig(fraction=0.2, compress=True, fill="copy-engine")
    with pytest.raises(UserError, match="copy engine only copies bytes"):
        OffloadConfig(fraction=0.2, compress=True, prefetch_distance=1, prefetch_fill="copy-engine")
