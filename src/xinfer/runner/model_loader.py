"""Builds the model for a device and dtype and fills its weights (checkpoint or dummy).
Expert tensors are created on `expert_device` (the host, when offloading), the rest on the
target device, so that offloaded experts never touch GPU memory."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch

from xinfer.config import ModelConfig, parse_dtype
from xinfer.models.moe_decoder import MoeForCausalLM
from xinfer.models.registry import get_model_class
from xinfer.parallel.group import current_group
from xinfer.parallel.model import rank_model_class
from xinfer.parallel.weights import init_dummy_shard, rank_narrowing
from xinfer.weights.dummy import init_dummy_weights
from xinfer.weights.loader import load_weights
from xinfer.weights.safetensors import iter_safetensors

logger = logging.getLogger(__name__)


def resolve_dtype(
    cfg: ModelConfig, requested: torch.dtype | None, device: torch.device
) -> torch.dtype:
    if requested is not None:
        return requested
    ckpt = (
        parse_dtype(cfg.torch_dtype)
        if cfg.torch_dtype in ("float32", "bfloat16", "float16")
        else None
    )
    if device.type == "cpu" and ckpt == torch.float16:
        return torch.float32  # fp16 matmuls on CPU are slow and lossy
    return ckpt or (torch.bfloat16 if device.type == "cuda" else torch.float32)


@contextmanager
def _default_dtype(dtype: torch.dtype):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def resident_weight_bytes(
    cfg: ModelConfig, dtype: torch.dtype, max_pos: int, include_experts: bool
) -> int:
    """Bytes the model will hold on its device (parameters and buffers; the routed experts
    only when `include_experts`), from a copy built on the meta device (no memory)."""
    cls = rank_model_class(get_model_class(cfg.architecture))
    with _default_dtype(dtype), torch.device("meta"):
        model = cls(cfg, max_pos, torch.device("meta"))
    tensors = list(model.parameters()) + list(model.buffers())
    if include_experts:
        tensors += [t for moe in model.moe_layers() for t in moe.expert_tensors.values()]
    return sum(t.numel() * t.element_size() for t in tensors)


def build_model(
    model_dir: str,
    cfg: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    max_pos: int,
    expert_device: torch.device,
    load_format: str = "auto",
    seed: int = 0,
    show_progress: bool = True,
) -> MoeForCausalLM:
    cls = rank_model_class(get_model_class(cfg.architecture))
    with _default_dtype(dtype), torch.device(device):
        model = cls(cfg, max_pos, expert_device)
    model.eval().requires_grad_(False)
    shard = rank_narrowing(model)  # None without tensor parallelism
    if load_format == "dummy" and shard is not None:
        init_dummy_shard(model, _full_model(cfg, dtype, max_pos), seed, device, show_progress)
    elif load_format == "dummy":
        init_dummy_weights(model, seed=seed, gen_device=device, show_progress=show_progress)
    else:
        stream = iter_safetensors(model_dir, show_progress)
        load_weights(model, stream, cls.checkpoint_renames, shard=shard)
    return model


def _full_model(cfg: ModelConfig, dtype: torch.dtype, max_pos: int) -> MoeForCausalLM:
    """The unsharded model on the meta device (shapes and order only, no memory)."""
    full_cfg = current_group().full_config
    with _default_dtype(dtype), torch.device("meta"):
        return get_model_class(full_cfg.architecture)(full_cfg, max_pos, torch.device("meta"))
