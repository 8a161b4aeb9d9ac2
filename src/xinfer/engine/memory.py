"""The memory arithmetic of start-up, in one place: what the weights take as stored (in the
checkpoint's formats, so quantized sizes), checked against host RAM (offloaded experts) and
the GPU (the rest) before anything is read; then how many KV blocks fit: from free device
memory on CUDA (honouring `--gpu-memory-limit-gb`, which makes the engine size itself as if
the GPU were that small), from a fixed token budget on CPU."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from xinfer.config import EngineConfig, ModelConfig
from xinfer.errors import UserError
from xinfer.kv.format import KVDtype

GIB = 1 << 30
_CPU_MAX_KV_BYTES = 2 * GIB
_GPU_WORKSPACE_BYTES = 1 * GIB  # activations, logits, graph pools


def usable_gpu_bytes(device: torch.device, limit_gb: float | None) -> int:
    """Bytes still free for us on `device`, as if its total were `limit_gb` when given.
    Blocks torch's caching allocator holds that no tensor uses (freed by an earlier engine of
    this process, or by start-up's own temporaries) count as free: the driver counts them as
    used, but our allocations reuse them."""
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if limit_gb is None:
        return free
    used = total - free
    return max(0, int(limit_gb * GIB) - used)


@dataclass(frozen=True)
class WeightPlan:
    """Bytes of the model's weights as stored. `device_bytes`: what stays on the device
    (everything, or everything but the routed experts when they are offloaded);
    `expert_bytes`: one routed expert (all its tensors); `host_expert_bytes`: every routed
    expert of every MoE layer (what the host store holds when offloading)."""

    device_bytes: int
    expert_bytes: int
    host_expert_bytes: int
    num_moe_layers: int
    is_offloaded: bool

    def check(self, device: torch.device, limit_gb: float | None, is_moe: bool) -> None:
        """Fail before loading, with the fix: host RAM for offloaded experts, the GPU for
        the rest."""
        if self.is_offloaded:
            from xinfer.offload.host_store import check_host_ram

            check_host_ram(self.host_expert_bytes)
        check_weights_fit(self.device_bytes, device, limit_gb, is_moe)


def check_weights_fit(
    weight_bytes: int, device: torch.device, limit_gb: float | None, is_moe: bool
) -> None:
    """Fail before loading, with the fix, when the GPU cannot hold the resident weights."""
    if device.type != "cuda":
        return
    free = usable_gpu_bytes(device, limit_gb)
    if weight_bytes + _GPU_WORKSPACE_BYTES <= free:
        return
    where = f" (--gpu-memory-limit-gb {limit_gb:g})" if limit_gb is not None else ""
    fix = (
        "keep the experts in host RAM with XINFER_MOE_OFFLOAD=auto (or a fraction such as 0.2)"
        if is_moe
        else "use a GPU with more memory or a smaller model"
    )
    raise UserError(
        f"the model's weights need {weight_bytes / GIB:.1f} GB of GPU memory but only "
        f"{free / GIB:.1f} GB is free{where}; {fix}"
    )


def gpu_kv_budget(engine: EngineConfig, device: torch.device) -> int:
    """Bytes the caches (KV blocks and any recurrent state) may take on the GPU."""
    budget = usable_gpu_bytes(device, engine.gpu_memory_limit_gb)
    return int(budget * engine.cache.gpu_memory_utilization) - _GPU_WORKSPACE_BYTES


def min_free_gpu_bytes(
    cfg: ModelConfig,
    engine: EngineConfig,
    kv_dtype: KVDtype,
    max_model_len: int,
    state_bytes_per_seq: int = 0,
) -> int:
    """Free device bytes the engine needs after its weights (and expert slots) to start: one
    `--max-model-len` sequence's KV blocks (or the `--num-gpu-blocks` asked for) and one
    request's recurrent state, plus the workspace, before `gpu_memory_utilization` takes its
    share: the inverse of `gpu_kv_budget`. `auto` offload keeps at least this much free."""
    block_size = engine.cache.block_size
    per_block = cfg.kv_bytes_per_token(kv_dtype) * block_size
    blocks = engine.cache.num_blocks
    if blocks is None:
        blocks = -(-max_model_len // block_size)
    need = blocks * per_block + state_bytes_per_seq + _GPU_WORKSPACE_BYTES
    return math.ceil(need / engine.cache.gpu_memory_utilization) + 1  # + 1: int() in gpu_kv_budget


def plan_num_blocks(
    cfg: ModelConfig,
    engine: EngineConfig,
    device: torch.device,
    kv_dtype: KVDtype,
    max_model_len: int,
    reserved_bytes: int = 0,
) -> int:
    """`reserved_bytes`: taken from the GPU budget first (hybrid models' recurrent state)."""
    block_size = engine.cache.block_size
    if engine.cache.num_blocks is not None:
        return engine.cache.num_blocks
    per_block = cfg.kv_bytes_per_token(kv_dtype) * block_size
    blocks_per_seq = -(-max_model_len // block_size)
    if device.type != "cuda":
        want = blocks_per_seq * min(engine.scheduler.max_num_seqs, 8)
        return max(blocks_per_seq, min(want, _CPU_MAX_KV_BYTES // per_block))
    return max(0, (gpu_kv_budget(engine, device) - reserved_bytes) // per_block)


def kv_shortfall_reason(free_after: dict[str, int], is_offload: bool, is_auto: bool) -> str:
    """What to add to the "KV cache fits fewer tokens than --max-model-len" error: where
    MoE offload sized its slots to leave one sequence's KV cache free, the GPU memory start-up
    took after that, step by step (`free_after`: free bytes after each start-up step in order,
    from "offload plan" (what the slot plan meant to leave) or "offload" to "kv sizing");
    "" where there is nothing to say. The fix it names: a larger reserve under `auto`, a
    smaller fraction otherwise (the reserve sizes `auto` only)."""
    first = next((k for k in ("offload plan", "offload") if k in free_after), None)
    if not is_offload or first is None or "kv sizing" not in free_after:
        return ""
    taken = free_after[first] - free_after["kv sizing"]
    if taken < 16 << 20:
        return ""
    steps = list(free_after)
    steps = steps[steps.index(first) : steps.index("kv sizing") + 1]
    parts = [
        f"{later} {(free_after[earlier] - free_after[later]) / GIB:.2f} GB"
        for earlier, later in zip(steps, steps[1:])
    ]
    return (
        f" (start-up took {taken / GIB:.2f} GB of GPU memory after MoE offload had sized its "
        f"slots to leave room for it: {', '.join(parts)}; "
        + ("a larger --moe-offload-reserve-gb" if is_auto else "a smaller --moe-offload fraction")
        + " leaves more)"
    )
