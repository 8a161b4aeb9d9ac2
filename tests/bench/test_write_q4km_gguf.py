"""bench/write_q4km_gguf.py's type mix (the writer itself is the peer kit's, which CI does
not have): llama.cpp's Q4_K_M choice for a model of more than 8 experts, layer by layer, and
the kit's fallback for rows Q6_K cannot hold."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import write_q4km_gguf as q4km  # noqa: E402


def test_more_bits_in_24_of_qwen3_30bs_48_layers():
    more = [i for i in range(48) if q4km.use_more_bits(i, 48)]
    # the first and last eighth, and every third layer between (llama.cpp's use_more_bits)
    assert more == [0, 1, 2, 3, 4, 5, *range(8, 42, 3), 42, 43, 44, 45, 46, 47]
    assert len(more) == 24


def test_q4km_types_by_tensor():
    t = q4km.q4km_type
    assert t("output.weight", "q4_k", 48) == "q6_k"
    assert t("token_embd.weight", "q4_k", 48) == "q4_k"
    assert t("blk.0.attn_v.weight", "q4_k", 48) == "q6_k"
    assert t("blk.6.attn_v.weight", "q4_k", 48) == "q4_k"
    assert t("blk.8.ffn_down_exps.weight", "q4_k", 48) == "q6_k"
    assert t("blk.8.ffn_down_shexp.weight", "q4_k", 48) == "q6_k"
    assert t("blk.9.ffn_down_exps.weight", "q4_k", 48) == "q4_k"
    assert t("blk.8.ffn_gate_exps.weight", "q4_k", 48) == "q4_k"
    assert t("blk.8.attn_q.weight", "q4_k", 48) == "q4_k"
    assert t("blk.0.attn_norm.weight", "f32", 48) == "f32"  # never retyped
    assert t("blk.0.ffn_down_exps.weight", "q5_0", 48) == "q5_0"  # a fallback stays


def test_the_plan_is_retyped_with_the_kits_fallback():
    def tensor_plan(cfg, wtype, embd_type, out_type):
        rows = [
            ("blk.0.ffn_down_exps.weight", (4, 256, 768), wtype, "exps"),
            ("blk.0.ffn_down_shexp.weight", (256, 1408), "q5_0", "shexp"),  # 1408: not 256k
            ("blk.1.ffn_down_shexp.weight", (256, 1408), "q5_0", "shexp"),
            ("blk.0.attn_norm.weight", (256,), "f32", "norm"),
            ("blk.0.attn_v.weight", (256, 256), wtype, "attn"),
            ("blk.1.attn_v.weight", (256, 256), wtype, "attn"),
            ("output.weight", (512, 256), out_type, "output"),
        ]
        return rows, "qwen3moe", {"L": 8}

    fallback = {"q4_k": "q5_0", "q6_k": "q8_0", "q5_0": "f16", "q8_0": "f16"}
    sizes = {"q6_k": 256, "q8_0": 32, "q4_k": 256, "q5_0": 32, "f16": 1, "f32": 1}

    def pick_type(t, ne0):
        while ne0 % sizes[t]:
            t = fallback[t]
        return t

    kit = types.SimpleNamespace(tensor_plan=tensor_plan, pick_type=pick_type)
    plan, _, _ = q4km._retyped(kit)({}, "q4_k", "q4_k", "q4_k")
    # layer 0's 1408-wide down: Q6_K falls back to Q8_0 (llama.cpp's fallback), layer 1's
    # keeps the plan's Q5_0; the norm stays f32
    want = ["q6_k", "q8_0", "q5_0", "f32", "q6_k", "q4_k", "q6_k"]
    assert [t for _, _, t, _ in plan] == want
    plan, _, _ = q4km._retyped(kit)({}, "q4_k", "q4_k", "q8_0")  # --output-type q8_0
    assert plan[-1][2] == "q8_0"


def test_a_type_is_refused(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["write_q4km_gguf.py", "--type", "q8_0", "--dry-run"])
    with pytest.raises(SystemExit, match="drop --type"):
        q4km.main()
