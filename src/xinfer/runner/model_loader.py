"""Builds the model for a device and dtype and fills its weights (checkpoint or dummy).
Layers are built without tensors, then each linear and expert layer creates them in the
weight format the checkpoint declares (`quant/`). Expert tensors are created on
`expert_device` (the host, when offloading), the rest on the target device, so that
offloaded experts never touch GPU memory."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

import torch

from xinfer.config import ModelConfig, parse_dtype
from xinfer.engine.memory import WeightPlan
from xinfer.errors import UserError
from xinfer.models.moe_decoder import MoeForCausalLM
from xinfer.models.registry import get_model_class
from xinfer.parallel.group import current_group
from xinfer.parallel.model import rank_model_class
from xinfer.parallel.weights import init_dummy_shard, rank_shard
from xinfer.quant.assign import assign_formats, deferred_weights
from xinfer.quant.config import QuantConfig, resolve_quant_config
from xinfer.weights.checkpoint import iter_checkpoint
from xinfer.weights.dummy import init_dummy_weights
from xinfer.weights.loader import load_weights

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


def quant_config(
    model_dir: str | Path | None,
    cfg: ModelConfig,
    dtype: torch.dtype,
    isq: QuantConfig | None = None,
) -> QuantConfig | None:
    """The checkpoint's declared weight format (None: unquantized), ignore list in our module
    names; refuses unknown methods before anything is allocated. `isq` (`--isq`) replaces
    it for a float checkpoint."""
    quant = resolve_quant_config(model_dir, cfg.hf_config, dtype)
    if isq is not None:
        if quant is not None:
            raise UserError(
                f"--isq quantizes bf16/fp16/fp32 checkpoints; this one is already stored "
                f"as {quant.method}: leave --isq out"
            )
        return isq
    if quant is None:
        return None
    if current_group() is not None and not quant.fmt.splits_for_tensor_parallel:
        raise UserError(
            f"{quant.fmt.name} checkpoints cannot be split for tensor parallelism yet; run them "
            "on one device (one --d)"
        )
    return quant.renamed(get_model_class(cfg.architecture).checkpoint_renames)


def _construct(
    cfg: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    max_pos: int,
    expert_device: torch.device,
    quant: QuantConfig | None,
) -> MoeForCausalLM:
    cls = rank_model_class(get_model_class(cfg.architecture))  # the TP wrapper, if any
    with _default_dtype(dtype), torch.device(device):
        with deferred_weights():
            model = cls(cfg, max_pos, expert_device)
        formats = assign_formats(model, quant, dtype)
    if quant is not None:
        counts: dict[str, int] = {}
        for name in formats.values():
            counts[name] = counts.get(name, 0) + 1
        logger.info("weight formats: %s", ", ".join(f"{n} x{c}" for n, c in counts.items()))
    return model


def plan_weights(
    cfg: ModelConfig,
    dtype: torch.dtype,
    max_pos: int,
    offload: bool,
    model_dir: str | Path | None = None,
    isq: QuantConfig | None = None,
) -> WeightPlan:
    """The weights' bytes as stored in the checkpoint's formats, from a copy of the model
    built on the meta device (no memory): what stays on the device and what the host store
    will hold when the experts are offloaded."""
    meta = torch.device("meta")
    model = _construct(cfg, meta, dtype, max_pos, meta, quant_config(model_dir, cfg, dtype, isq))
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    rest = nbytes(list(model.parameters()) + list(model.buffers()))
    moe = model.moe_layers()
    experts = sum(nbytes(layer.expert_tensors.values()) for layer in moe)
    return WeightPlan(
        device_bytes=rest if offload else rest + experts,
        expert_bytes=max((layer.expert_weights.expert_bytes for layer in moe), default=0),
        host_expert_bytes=experts,
        num_moe_layers=len(moe),
        is_offloaded=offload,
    )


def resident_weight_bytes(
    cfg: ModelConfig,
    dtype: torch.dtype,
    max_pos: int,
    include_experts: bool,
    model_dir: str | Path | None = None,
    isq: QuantConfig | None = None,
) -> int:
    """Bytes the model holds on its device (the routed experts only when
    `include_experts`): `plan_weights(...).device_bytes`."""
    return plan_weights(cfg, dtype, max_pos, not include_experts, model_dir, isq).device_bytes


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
    isq: QuantConfig | None = None,
) -> MoeForCausalLM:
    quant = quant_config(model_dir, cfg, dtype, isq)
    model = _construct(cfg, device, dtype, max_pos, expert_device, quant)
    model.eval().requires_grad_(False)
    shard = rank_shard(model, lambda: _full_model(dtype, max_pos))  # None without TP
    if load_format == "dummy" and shard is not None:
        full = _full_model(dtype, max_pos)
        init_dummy_shard(model, shard, full, seed, device, show_progress)
    elif load_format == "dummy":
        init_dummy_weights(model, seed=seed, gen_device=device, show_progress=show_progress)
    else:
        cls = get_model_class(cfg.architecture)
        tensors = iter_checkpoint(model_dir, cfg.hf_config, show_progress, device)
        tensors = model.adapt_checkpoint(tensors)  # the model's own skips and reshapes
        load_weights(model, tensors, cls.checkpoint_renames, cls.merged_projections, shard)
    return model


def _full_model(dtype: torch.dtype, max_pos: int) -> MoeForCausalLM:
    """The unsharded model of this tensor-parallel run on the meta device (its layers' full
    sizes and its parameters' order, no memory)."""
    full_cfg = current_group().full_config
    with _default_dtype(dtype), torch.device("meta"):
        return get_model_class(full_cfg.architecture)(full_cfg, max_pos, torch.device("meta"))
