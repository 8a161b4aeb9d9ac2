"""Every `XINFER_*` environment variable, read and validated here and nowhere else.
Each is a function so that a value set after import (tests, the CLI) is honoured."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from xinfer.errors import UserError


def _get(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def is_set(name: str) -> bool:
    """The variable is set to something other than blanks."""
    return _get(name) is not None


def _float(name: str, default: float) -> float:
    raw = _get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UserError(f"{name} must be a number, got {raw!r}")
    return value


def _bool(name: str, default: bool = False) -> bool:
    raw = _get(name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise UserError(f"{name} must be 1 or 0, got {raw!r}")


def XINFER_MOE_OFFLOAD() -> str | None:
    """`auto`, a fraction in (0, 1], or unset (no offload); validated by OffloadConfig.parse."""
    return _get("XINFER_MOE_OFFLOAD")


def XINFER_MOE_OFFLOAD_RESERVE_GB() -> float:
    return _float("XINFER_MOE_OFFLOAD_RESERVE_GB", 2.5)


def XINFER_MOE_OFFLOAD_PROFILE() -> bool:
    return _bool("XINFER_MOE_OFFLOAD_PROFILE")


def XINFER_MOE_OFFLOAD_POLICY() -> str | None:
    """`lfu` (the default when unset) or `lru`: which expert a miss evicts; validated by
    OffloadConfig."""
    raw = _get("XINFER_MOE_OFFLOAD_POLICY")
    return raw.strip().lower() if raw else None


def XINFER_HOST_HUGE_PAGES() -> bool:
    """0: large host tensors (offloaded experts) on 4 KiB pages instead of transparent huge
    pages (see xinfer/host_memory.py); default on."""
    return _get("XINFER_HOST_HUGE_PAGES") is None or _bool("XINFER_HOST_HUGE_PAGES")


def XINFER_MOE_OFFLOAD_COMPRESS() -> bool:
    """1: keep bf16 offloaded experts packed in host RAM (see --moe-offload-compress)."""
    return _bool("XINFER_MOE_OFFLOAD_COMPRESS")


def XINFER_API_KEY() -> str | None:
    return _get("XINFER_API_KEY")


def XINFER_DISABLE_TRITON() -> bool:
    """Force the pure-torch reference kernels even on CUDA (debugging, A/B tests)."""
    return _bool("XINFER_DISABLE_TRITON")


def XINFER_PDL() -> bool:
    """Launch the decode kernels with programmatic dependent launch on sm_90+ GPUs
    (kernels/pdl.py; on unless XINFER_PDL=0: +7-9% batch-1 decode, measured on the H100)."""
    return _bool("XINFER_PDL", default=True)


def XINFER_PREFILL_ATTENTION() -> str:
    """`triton` (default) or `flash`: a long one-sequence prefill step (a prompt pass's
    chunks) on torch's flash attention instead of the Triton kernel (kernels/attn_flash.py)."""
    raw = (_get("XINFER_PREFILL_ATTENTION") or "triton").lower()
    if raw not in ("triton", "flash"):
        raise UserError(f"XINFER_PREFILL_ATTENTION must be triton or flash, got {raw!r}")
    return raw


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def XINFER_LOG_LEVEL() -> str | None:
    """One of LOG_LEVELS (any case), or None when unset (`--log-level` wins over it)."""
    raw = _get("XINFER_LOG_LEVEL")
    if raw is not None and raw.lower() not in LOG_LEVELS:
        raise UserError(f"XINFER_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {raw!r}")
    return None if raw is None else raw.lower()


def HF_HUB_OFFLINE() -> bool:
    """huggingface_hub's own switch: use only the local hub cache, never the network."""
    return _bool("HF_HUB_OFFLINE")


@dataclass(frozen=True)
class TorchrunRanks:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def torchrun_ranks() -> TorchrunRanks | None:
    """torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE (not ours, but read here
    with the rest); None unless torchrun started this process as one of several."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    raw = [_get(n) for n in names]
    if raw[1] is None or raw[0] is None:
        return None
    try:
        rank, world, local, local_world = (int(v) if v is not None else None for v in raw)
    except ValueError:
        raise UserError(f"torchrun's {', '.join(names)} must be integers, got {raw}") from None
    if world <= 1:
        return None
    local = rank if local is None else local
    local_world = world if local_world is None else local_world
    return TorchrunRanks(rank, world, local, local_world)
