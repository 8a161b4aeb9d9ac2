"""Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`): the Qwen3-Next hybrid decoder with every layer
MoE (top-k always renormalised) and the linear layers' projections stored apart
(`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`; merged here into `in_proj_qkvz` and
`in_proj_ba`). Checkpoints are usually
`Qwen3_5MoeForConditionalGeneration`: the text model's config sits in `text_config` and its
weights under `model.language_model.`; the vision tower (`model.visual.`) and the
multi-token prediction weights (`mtp.`) are skipped with one log line each. Text only:
image inputs are refused before they reach the engine. Positions are text positions, for
which the interleaved multimodal RoPE equals plain RoPE."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from xinfer.models.hf_config import decoder_fields, moe_fields
from xinfer.models.hybrid_decoder import HybridConfig, HybridForCausalLM
from xinfer.models.qwen3_next import MTP_NOTE, hybrid_fields, skip_unused

VISION_NOTE = "the vision tower (this engine generates text only)"


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The text model's keys: `text_config` over the top level (a None there does not hide
    a value above it), or the top level itself for a text-only checkpoint."""
    text = hf.get("text_config")
    if not text:
        return hf
    top = {k: v for k, v in hf.items() if k not in ("text_config", "vision_config")}
    return {**top, **{k: v for k, v in text.items() if v is not None}}


def config_from_hf(hf: dict[str, Any], architecture: str) -> HybridConfig:
    text = text_config(hf)
    fields = {**decoder_fields(text, architecture), **moe_fields(text)}
    fields.update(norm_topk_prob=True, mlp_only_layers=(), decoder_sparse_step=1)
    return HybridConfig(
        **fields,
        **hybrid_fields(text),
        qkv_bias=bool(text.get("attention_bias", False)),
        qk_norm="head",
        hf_config=hf,
    )


class Qwen3_5MoeForCausalLM(HybridForCausalLM):
    checkpoint_renames = (("model.language_model.", "model."),)
    split_projections = True
    merged_projections = {
        "in_proj_qkv": ("in_proj_qkvz", "in_proj_qkv"),
        "in_proj_z": ("in_proj_qkvz", "in_proj_z"),
        "in_proj_b": ("in_proj_ba", "in_proj_b"),
        "in_proj_a": ("in_proj_ba", "in_proj_a"),
    }

    def adapt_checkpoint(
        self, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        skipped = {"model.visual.": VISION_NOTE, "mtp.": MTP_NOTE}
        return super().adapt_checkpoint(skip_unused(tensors, skipped))
