"""The README's table of supported architectures with the memory a typical checkpoint
needs, computed from the published `config.json` values below by the engine's own sizing
(`plan_weights`: the model built on the meta device in the checkpoint's weight format; the
offload slot rule, the staging buffer, the KV cache, the host-RAM check's margin). `python scripts/model_memory.py` prints the table;
tests check that the README holds exactly this output. Add a row: add its config here."""

from __future__ import annotations

import torch

from xinfer.config import ModelConfig
from xinfer.engine.memory import _GPU_WORKSPACE_BYTES
from xinfer.offload.host_store import _RAM_MARGIN_BYTES
from xinfer.offload.sizing import slots_for_fraction
from xinfer.runner.model_loader import plan_weights

GIB = 1 << 30
CONTEXT = 8192  # one sequence of this many tokens in the KV cache
FRACTION = 0.2  # XINFER_MOE_OFFLOAD for the offload column

# (hub id, the fields of its published config.json that sizing reads)
CHECKPOINTS: list[tuple[str, dict]] = [
    ("allenai/OLMoE-1B-7B-0924", dict(
        architectures=["OlmoeForCausalLM"], model_type="olmoe", hidden_size=2048,
        intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, vocab_size=50304,
        max_position_embeddings=4096, tie_word_embeddings=False,
    )),
    ("Qwen/Qwen1.5-MoE-A2.7B", dict(
        architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", hidden_size=2048,
        intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=16, num_experts=60, num_experts_per_tok=4, vocab_size=151936,
        max_position_embeddings=8192, tie_word_embeddings=False,
    )),
    ("Qwen/Qwen3-30B-A3B", dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
        intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, vocab_size=151936, max_position_embeddings=40960,
        tie_word_embeddings=False,
    )),
    ("Qwen/Qwen3-30B-A3B-FP8", dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
        intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, vocab_size=151936, max_position_embeddings=40960,
        tie_word_embeddings=False,
        quantization_config=dict(activation_scheme="dynamic", fmt="e4m3", quant_method="fp8",
                                 weight_block_size=[128, 128]),
    )),
    ("Qwen/Qwen2-57B-A14B", dict(
        architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", hidden_size=3584,
        intermediate_size=18944, moe_intermediate_size=2560,
        shared_expert_intermediate_size=20480, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, num_experts=64, num_experts_per_tok=8, vocab_size=151936,
        max_position_embeddings=32768, tie_word_embeddings=False,
    )),
    ("mistralai/Mixtral-8x7B-v0.1", dict(
        architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
        max_position_embeddings=32768, tie_word_embeddings=False,
    )),
    ("Qwen/Qwen3-235B-A22B", dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=4096,
        intermediate_size=12288, moe_intermediate_size=1536, num_hidden_layers=94,
        num_attention_heads=64, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, vocab_size=151936, max_position_embeddings=40960,
        tie_word_embeddings=False,
    )),
]  # fmt: skip


def memory_row(hf: dict, dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """GiB: all weights, routed experts, VRAM with everything resident, VRAM with FRACTION
    of each layer's experts in slots (plus the staging buffer), and host RAM for offload."""
    cfg = ModelConfig.from_hf(hf)
    plan = plan_weights(cfg, dtype, CONTEXT, offload=True)
    dense, experts, expert = plan.device_bytes, plan.host_expert_bytes, plan.expert_bytes
    slots = slots_for_fraction(FRACTION, cfg.num_experts, cfg.num_experts_per_tok)
    kv = cfg.kv_bytes_per_token(dtype) * CONTEXT
    staging = cfg.num_experts * expert if slots < cfg.num_experts else 0
    offloaded = dense + plan.num_moe_layers * slots * expert + staging
    return {
        "weights": (dense + experts) / GIB,
        "experts": experts / GIB,
        "vram_resident": (dense + experts + kv + _GPU_WORKSPACE_BYTES) / GIB,
        "vram_offload": (offloaded + kv + _GPU_WORKSPACE_BYTES) / GIB,
        "host_ram": (experts + _RAM_MARGIN_BYTES) / GIB,
    }


def weight_format(hf: dict) -> str:
    quant = hf.get("quantization_config")
    return "bf16" if quant is None else quant["quant_method"]


def table() -> str:
    lines = [
        "| checkpoint | architecture | format | weights | routed experts | "
        f"VRAM, all on GPU | VRAM, `XINFER_MOE_OFFLOAD={FRACTION}` | host RAM, offload |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for repo_id, hf in CHECKPOINTS:
        r = memory_row(hf)
        lines.append(
            f"| `{repo_id}` | {hf['architectures'][0]} | {weight_format(hf)} | "
            f"{r['weights']:.1f} | "
            f"{r['experts']:.1f} | {r['vram_resident']:.1f} | {r['vram_offload']:.1f} | "
            f"{r['host_ram']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
