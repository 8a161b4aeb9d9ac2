"""Tensor-parallel pieces that need no second process: the step message round trip, how
checkpoint tensors narrow per rank, the rank config and its refusals, where the all-reduces
go, the device list, and how the ranks' offload stats add up."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_models as tm
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xinfer.config import ModelConfig
from xinfer.errors import UserError
from xinfer.models.registry import get_model_class
from xinfer.parallel import devices
from xinfer.parallel.channel import pack_batch, unpack_batch
from xinfer.parallel.plan import Split, module_splits, rank_config, reduction_points
from xinfer.parallel.stats import combine_stats
from xinfer.parallel.weights import narrow_tensor
from xinfer.runner.model_runner import HostBatch


class FakeGroup:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size


def _config(arch: str, **overrides) -> ModelConfig:
    cfg_cls, model_cls = tm.hf_classes(arch)
    hf = cfg_cls(**{**tm._COMMON, **tm.ARCHS[arch], **overrides}).to_dict()
    return ModelConfig.from_hf({**hf, "architectures": [model_cls.__name__]})


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=6),
    st.integers(0, 2),
    st.booleans(),
)
def test_batch_round_trip(query_lens, extra_blocks, has_ids):
    rng = np.random.default_rng(sum(query_lens))
    hb = HostBatch([], [], [], [], [0], [], [], max(query_lens))
    for n in query_lens:
        hb.input_ids += rng.integers(0, 1 << 40, n).tolist()
        hb.positions += list(range(n))
        hb.slots += rng.integers(-1, 1000, n).tolist()
        hb.seq_lens.append(n + 3)
        hb.query_start_loc.append(hb.query_start_loc[-1] + n)
        hb.logits_indices.append(hb.query_start_loc[-1] - 1)
        hb.block_tables.append(rng.integers(0, 99, 1 + extra_blocks + n % 3).tolist())
        if has_ids:  # a hybrid model's recurrent-state slot per request
            hb.state_ids.append(int(rng.integers(0, 64)))
        hb.request_rows.append(int(rng.integers(0, 64)))  # routing: per-request rows, keys
        hb.request_keys.append(int(rng.integers(0, 1 << 40)))
    out, out_has_ids = unpack_batch(pack_batch(hb, has_ids))
    assert out == hb and out_has_ids == has_ids


COLUMN, ROW = Split(0), Split(-1)


def test_column_and_row_narrowing():
    t = torch.arange(24.0).view(4, 6)
    col = [narrow_tensor(t, (2, 6), COLUMN, FakeGroup(r, 2)) for r in (0, 1)]
    assert torch.equal(torch.cat(col, 0), t)
    row = [narrow_tensor(t, (4, 3), ROW, FakeGroup(r, 2)) for r in (0, 1)]
    assert torch.equal(torch.cat(row, 1), t)
    bias, first = torch.ones(4), Split(0, is_first_rank_only=True)
    assert torch.equal(narrow_tensor(bias, (4,), first, FakeGroup(0, 2)), bias)
    assert not narrow_tensor(bias, (4,), first, FakeGroup(1, 2)).any()  # added once


def test_fused_gate_up_splits_each_half():
    """[2I, H] with I = 4 over 2 ranks: rank r gets gate rows and up rows of its slice."""
    w13 = torch.arange(8 * 3.0).view(8, 3)
    r1 = narrow_tensor(w13, (4, 3), Split(0, parts=2), FakeGroup(1, 2))
    assert torch.equal(r1, torch.cat([w13[2:4], w13[6:8]], 0))


def test_kv_heads_replicated_when_fewer_than_ranks():
    k = torch.arange(2 * 3.0).view(2, 3)  # 2 KV heads of dim 1 (rows)
    got = [narrow_tensor(k, (1, 3), COLUMN, FakeGroup(r, 4)) for r in range(4)]
    assert [g[0, 0].item() for g in got] == [0.0, 0.0, 3.0, 3.0]  # heads 0, 0, 1, 1


def test_padded_vocab_rows():
    w = torch.arange(5.0).view(5, 1)
    a, b = (narrow_tensor(w, (3, 1), Split(0, is_padded=True), FakeGroup(r, 2)) for r in (0, 1))
    assert a.flatten().tolist() == [0, 1, 2] and b.flatten().tolist() == [3, 4, 0]


def test_indivisible_split_is_refused():
    assert narrow_tensor(torch.ones(5, 2), (2, 2), COLUMN, FakeGroup(0, 2)) is None


def test_rank_config_divides_heads_and_intermediates():
    cfg = _config("qwen2_moe")
    rc = rank_config(cfg, 2)
    assert (rc.num_heads, rc.num_kv_heads) == (2, 1)
    assert rc.moe_intermediate_size == cfg.moe_intermediate_size // 2
    assert rc.shared_expert_intermediate_size == cfg.shared_expert_intermediate_size // 2
    assert rc.intermediate_size == cfg.intermediate_size // 2
    assert rc.vocab_size == cfg.vocab_size and rc.head_dim == cfg.head_dim
    assert rank_config(_config("qwen3_moe", num_key_value_heads=1), 4).num_kv_heads == 1


@pytest.mark.parametrize(
    "overrides, size, needle",
    [
        ({}, 3, "attention heads (4)"),
        ({"num_attention_heads": 6, "num_key_value_heads": 3}, 2, "KV heads (3)"),
        ({"num_attention_heads": 6, "num_key_value_heads": 2}, 3, "cannot share 2 KV heads"),
        ({"moe_intermediate_size": 30}, 4, "experts' intermediate size (30)"),
        ({"intermediate_size": 90}, 4, "dense MLP intermediate size (90)"),
    ],
)
def test_rank_config_refuses_what_does_not_divide(overrides, size, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        rank_config(_config("qwen3_moe", **overrides), size)


def test_declared_splits_and_reduction_points():
    cfg = _config("qwen2_moe")  # dense layers 0 and 2, shared expert in layer 1
    with torch.device("meta"):
        model = get_model_class(cfg.architecture)(cfg, 64, torch.device("meta"))
    splits = module_splits(model)
    layer = "model.layers.1"
    assert splits[f"{layer}.self_attn.qkv_proj"] == "column"
    assert splits[f"{layer}.self_attn.o_proj"] == "row"
    assert splits[f"{layer}.mlp.experts.w13"] == "column"
    assert splits[f"{layer}.mlp.experts.w2"] == "row"
    assert splits[f"{layer}.mlp.shared_expert.down_proj"] == "row"
    assert f"{layer}.mlp.gate" not in splits  # router replicated
    assert "model.embed_tokens" not in splits and splits["lm_head"] == "vocab"
    points = reduction_points(model)
    # one all-reduce after attention and one after the MLP / MoE block of each layer
    assert len(points) == 2 * cfg.num_layers
    block = model.model.layers[1].mlp
    assert block in points and block.shared_expert not in points and block.experts not in points


def test_parse_devices(monkeypatch):
    assert devices.parse_devices("cpu,cpu") == ["cpu", "cpu"]
    with pytest.raises(UserError, match="mixes CPU and GPU"):
        devices.parse_devices("cpu,0")
    with pytest.raises(UserError, match="unknown device"):
        devices.parse_devices("0,tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UserError, match="asks for 2 GPUs .* cuda:1 does not exist"):
        devices.parse_devices("0,1")  # more ranks than devices
    with pytest.raises(UserError, match="twice"):
        devices.parse_devices("0,0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="no CUDA GPU"):
        devices.parse_devices("0,1")


def test_torchrun_environment(monkeypatch):
    for k, v in dict(RANK="1", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2").items():
        monkeypatch.setenv(k, v)
    device, par = devices.resolve_parallel("cpu,cpu")
    assert device == "cpu" and (par.size, par.rank, par.launcher) == (4, 1, "torchrun")
    with pytest.raises(UserError, match="one device per local process"):
        devices.resolve_parallel("cpu")


def _snapshot(hits: int, misses: int, slots: int, device: str) -> dict:
    layer = dict(hits=hits, misses=misses, calls=1, bytes_copied=misses * 10, staging_copies=0)
    layer.update(staging_bytes=0, bytes_moved=misses * 10, hit_rate=0.0, layer=0, slots=slots)
    return {
        **{k: v for k, v in layer.items() if k not in ("layer", "slots")},
        "num_layers": 1,
        "slots_per_layer": [slots],
        "num_experts": [8],
        "pinned_gb": 1.0,
        "slot_gb": 0.5,
        "staging_gb": 0.0,
        "device": device,
        "layers": [layer],
    }


def test_combine_stats_adds_ranks_up():
    out = combine_stats([_snapshot(3, 1, 4, "cuda:0"), _snapshot(1, 3, 2, "cuda:1")])
    assert (out["hits"], out["misses"], out["bytes_moved"]) == (4, 4, 40)
    assert out["hit_rate"] == 0.5 and out["layers"][0]["hit_rate"] == 0.5
    assert out["slots_per_layer"] == [2] and out["pinned_gb"] == 2.0
    assert out["tp_size"] == 2 and out["device"] == "cuda:0,cuda:1" and len(out["ranks"]) == 2


def test_undeclared_resized_layer_is_refused(monkeypatch):
    """A layer that the rank config resizes but that declares no split (a model whose
    attention block lacks `tp_plan`) is refused instead of loaded by a guess."""
    from xinfer.models.moe_decoder import DecoderAttention
    from xinfer.parallel.weights import RankShard

    cfg = _config("qwen3_moe")
    cls = get_model_class(cfg.architecture)
    with torch.device("meta"):
        full = cls(cfg, 64, torch.device("meta"))
        rank = cls(rank_config(cfg, 2), 64, torch.device("meta"))
    RankShard(rank, full, FakeGroup(0, 2))  # declared: accepted
    monkeypatch.setattr(DecoderAttention, "tp_plan", {})
    with pytest.raises(UserError, match="does not support Qwen3MoeForCausalLM yet.*qkv_proj"):
        RankShard(rank, full, FakeGroup(0, 2))
