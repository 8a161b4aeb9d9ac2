"""Qwen3-Next: the hybrid decoder (Gated DeltaNet + gated full attention, see
`hybrid_decoder.py`) with Qwen-style MoE layers (`mlp_only_layers`, `decoder_sparse_step`,
a shared expert). Its checkpoints interleave the linear layers' projections per key head
(`in_proj_qkvz` = [q k v z] of head 0, then head 1, …; `in_proj_ba` likewise), which
`adapt_checkpoint` regroups into [q k v | z] and [b | a] while loading. Multi-token
prediction weights (`mtp.*`) are skipped: speculative decoding does not use them yet."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from xinfer.errors import UserError
from xinfer.models.hf_config import decoder_fields, moe_fields
from xinfer.models.hybrid_decoder import FULL, LINEAR, HybridConfig, HybridForCausalLM

logger = logging.getLogger("xinfer")


def hybrid_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """The linear-attention keys of Qwen3-Next / Qwen3.5 text configs."""
    num_layers = hf["num_hidden_layers"]
    interval = hf.get("full_attention_interval", 4)
    default_types = [LINEAR if (i + 1) % interval else FULL for i in range(num_layers)]
    rope = hf.get("rope_parameters") or {}
    return dict(
        layer_types=tuple(hf.get("layer_types") or default_types),
        linear_num_key_heads=hf.get("linear_num_key_heads", 16),
        linear_num_value_heads=hf.get("linear_num_value_heads", 32),
        linear_key_head_dim=hf.get("linear_key_head_dim", 128),
        linear_value_head_dim=hf.get("linear_value_head_dim", 128),
        linear_conv_kernel_dim=hf.get("linear_conv_kernel_dim", 4),
        # transformers' default when neither the config nor its rope parameters say
        partial_rotary_factor=rope.get(
            "partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)
        ),
    )


def config_from_hf(hf: dict[str, Any], architecture: str) -> HybridConfig:
    return HybridConfig(
        **decoder_fields(hf, architecture),
        **moe_fields(hf),
        **hybrid_fields(hf),
        qkv_bias=bool(hf.get("attention_bias", False)),
        qk_norm="head",
        hf_config=hf,
    )


def skip_unused(
    tensors: Iterable[tuple[str, torch.Tensor]], skipped: dict[str, str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Drop tensors under the `skipped` prefixes ({prefix: what they are}), with one log line
    per prefix once the stream is done."""
    counts = dict.fromkeys(skipped, 0)
    for name, tensor in tensors:
        prefix = next((p for p in skipped if name.startswith(p)), None)
        if prefix is None:
            yield name, tensor
        else:
            counts[prefix] += 1
    for prefix, count in counts.items():
        if count:
            logger.info(
                "skipped %d checkpoint tensors under %r: %s", count, prefix, skipped[prefix]
            )


MTP_NOTE = "multi-token prediction weights (not used: no speculative decoding yet)"


class Qwen3NextForCausalLM(HybridForCausalLM):
    def adapt_checkpoint(
        self, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        cfg = self.config
        hk, dk = cfg.linear_num_key_heads, cfg.linear_key_head_dim
        per_k = cfg.linear_num_value_heads // hk  # value heads per key head
        qkvz_split = [dk, dk, per_k * cfg.linear_value_head_dim, per_k * cfg.linear_value_head_dim]
        for name, tensor in skip_unused(tensors, {"mtp.": MTP_NOTE}):
            # every tensor of the two projections (weights, and block scales if quantized)
            if ".linear_attn.in_proj_qkvz." in name:
                tensor = _regroup(name, tensor, hk, qkvz_split)
            elif ".linear_attn.in_proj_ba." in name:
                tensor = _regroup(name, tensor, hk, [per_k, per_k])
            yield from super().adapt_checkpoint([(name, tensor)])


def _regroup(name: str, t: torch.Tensor, num_groups: int, split: list[int]) -> torch.Tensor:
    """Rows [g0: p0 p1 …][g1: p0 p1 …]… → [p0 of all groups][p1 of all groups]…; a tensor
    with one row per block of rows (block scales) is regrouped by blocks."""
    rows = num_groups * sum(split)
    block = rows // t.shape[0] if t.dim() and t.shape[0] and rows % t.shape[0] == 0 else 0
    if not block or any(s % block for s in split):
        raise UserError(
            f"checkpoint tensor {name!r} ({tuple(t.shape)}) does not split into the "
            f"{num_groups} key-head groups of {sum(split)} rows this config implies"
        )
    grouped = t.reshape(num_groups, sum(split) // block, *t.shape[1:])
    parts = grouped.split([s // block for s in split], dim=1)
    return torch.cat([p.reshape(-1, *t.shape[1:]) for p in parts])
