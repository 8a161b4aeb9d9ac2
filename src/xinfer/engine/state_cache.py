"""Per-request recurrent state of hybrid models (linear-attention layers), beside the paged
KV cache: every running request owns one state slot, taken when it is scheduled and given
back when it finishes, is aborted or is preempted (a preempted request recomputes its state
from its tokens). The slot count comes out of the same memory budget as the KV blocks
(`plan_state_slots`); the state tensors themselves are allocated per layer and bound to the
layers by `bind_state_caches`."""

from __future__ import annotations

import logging

import torch
from torch import nn

from xinfer.config import EngineConfig, ModelConfig
from xinfer.engine.memory import GIB, gpu_kv_budget
from xinfer.errors import UserError
from xinfer.kv.format import KVDtype

logger = logging.getLogger("xinfer")


class StateSlotAllocator:
    """A free list of state slot ids (low ids first)."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError("a hybrid model needs at least one state slot")
        self.num_slots = num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free state slot")
        return self._free.pop()

    def free(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or slot in self._free:
            raise RuntimeError(f"state slot {slot} is not allocated")
        self._free.append(slot)


def plan_state_slots(
    cfg: ModelConfig,
    engine: EngineConfig,
    device: torch.device,
    state_dtype: torch.dtype,
    kv_dtype: KVDtype,
    max_model_len: int,
    copies: int = 1,
) -> int:
    """How many requests' states (`copies` rows each) to allocate: one per schedulable
    sequence (`--max-num-seqs`), fewer when the GPU budget must also keep one full-length
    sequence's KV blocks; 0 for a model without recurrent state."""
    per_seq = cfg.state_bytes_per_seq(state_dtype) * copies
    if per_seq == 0:
        return 0
    want = engine.scheduler.max_num_seqs
    if device.type != "cuda" or engine.cache.num_blocks is not None:
        return want
    block_size = engine.cache.block_size
    min_kv = -(-max_model_len // block_size) * block_size * cfg.kv_bytes_per_token(kv_dtype)
    fit = (gpu_kv_budget(engine, device) - min_kv) // per_seq
    if fit < 1:
        raise UserError(
            f"one sequence's recurrent state ({per_seq / GIB:.2f} GB) and KV cache do not fit "
            "in GPU memory; lower --max-model-len, offload more experts or free memory"
        )
    if fit < want:
        logger.info("recurrent state fits %d sequences; --max-num-seqs lowered from %d", fit, want)
    return min(want, fit)


def bind_state_caches(
    model: nn.Module,
    num_slots: int,
    state_dtype: torch.dtype,
    device: torch.device,
    copies: int = 1,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Allocate each state layer's (conv, delta-rule) tensors for `num_slots` requests of
    `copies` rows each (2: double-buffered, so that decode look-ahead can drop a queued
    step) and bind them; the conv state is in `state_dtype`, the delta-rule state float32."""
    caches = []
    for layer in model.state_layers():
        conv_shape, ssm_shape = layer.state_shapes(num_slots * copies)
        conv = torch.zeros(conv_shape, dtype=state_dtype, device=device)
        ssm = torch.zeros(ssm_shape, dtype=torch.float32, device=device)
        layer.bind_state(conv, ssm, copies)
        caches.append((conv, ssm))
    return caches
