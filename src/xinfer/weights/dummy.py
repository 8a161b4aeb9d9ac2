"""Random weights from `config.json` alone, made directly where each tensor lives (for
benchmarking shapes whose checkpoint does not fit on disk). Linear and expert layers get
valid tensors of their weight format (N(0, 0.02) weights, quantized by the format's own
quantizer); norm weights are ones, other parameters N(0, 0.02).

Offloaded experts live in host memory and are drawn on the GPU: they reach the host a chunk
of experts at a time (drawn into a GPU buffer, one DMA copy into pinned memory, one threaded
host copy into place). Copied from the GPU into the host tensors an expert at a time, the
Qwen3.5-35B-A3B shape's 64.4 GB took 25.6 s on an H100 host even with the pages faulted in
beforehand (62.6 s before that)."""

from __future__ import annotations

import torch
from torch import nn
from tqdm import tqdm

from xinfer.quant.base import expert_key

_STD = 0.02
# GPU buffer and pinned buffer of a chunk of experts drawn for the host (each)
_CHUNK_BYTES = 256 << 20


def _copy_into(dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
    for name, t in src.items():
        dst[name].copy_(t)


@torch.no_grad()
def init_dummy_weights(
    model: nn.Module,
    seed: int = 0,
    gen_device: torch.device | None = None,
    show_progress: bool = True,
) -> None:
    """Fill every tensor. Host-resident tensors are generated on `gen_device` (the GPU, when
    there is one) and copied, which is far faster than the CPU generator for tens of GB.
    Experts are drawn one at a time, so that resident and offloaded engines get exactly the
    same weights from the same seed."""
    gen_device = torch.device(gen_device or next(model.parameters()).device)
    gen = torch.Generator(device=gen_device).manual_seed(seed)
    formatted: set[str] = set()
    modules = list(model.named_modules())
    for prefix, module in tqdm(modules, desc="Dummy weights", disable=not show_progress):
        if hasattr(module, "expert_tensors") and hasattr(module, "create_weights"):
            draw_experts(module, gen, gen_device)
        elif hasattr(module, "weight_names") and hasattr(module, "create_weights"):
            fmt = module.weight_format
            tensors = fmt.dummy(module.out_features, module.in_features, gen, _STD)
            _copy_into(module.weight_tensors(), tensors)
            formatted |= {f"{prefix}.{n}" for n in module.weight_names}
    for name, t in model.named_parameters():
        if name in formatted:
            continue
        if name.endswith("norm.weight"):
            t.fill_(1.0)
            continue
        src = torch.empty(t.shape, dtype=t.dtype, device=gen_device)
        t.copy_(src.normal_(0, _STD, generator=gen))


def draw_experts(
    module: nn.Module,
    gen: torch.Generator,
    gen_device: torch.device,
    chunk_bytes: int = _CHUNK_BYTES,
    chunked: bool | None = None,
) -> None:
    """Draw an MoE layer's experts one at a time, in one order wherever they live (so that
    resident and offloaded engines get the same weights), into its expert tensors. Tensors
    on another device than the generator's (offloaded experts, drawn on the GPU) are written
    a chunk of experts at a time through `_ChunkedCopy` (`chunked` forces the choice)."""
    ew = module.expert_weights
    dst = module.expert_tensors
    if chunked is None:
        chunked = any(t.device.type != gen_device.type for t in dst.values())
    chunks = _ChunkedCopy(dst, module.num_experts, gen_device, chunk_bytes) if chunked else None
    for e in range(module.num_experts):
        for proj in ("w13", "w2"):
            tensors = ew.proj_fmt(proj).dummy(*ew.proj_nk(proj), gen, _STD)
            for name, t in tensors.items():
                if chunks is None:
                    dst[expert_key(proj, name)][e].copy_(t)
                else:
                    chunks.put(expert_key(proj, name), e, t)
        if chunks is not None:
            chunks.expert_done(e)


class _ChunkedCopy:
    """Experts drawn on `gen_device` for tensors elsewhere: each expert's tensors land in a
    buffer of `n` experts beside the generator; when it is full (or the last expert is in),
    one copy moves it into a pinned buffer (DMA, from a GPU) and one threaded host copy into
    the destination's rows."""

    def __init__(
        self, dst: dict[str, torch.Tensor], num_experts: int, gen_device: torch.device,
        chunk_bytes: int,
    ) -> None:  # fmt: skip
        per_expert = sum(t[0].numel() * t.element_size() for t in dst.values())
        self.n = max(1, min(num_experts, chunk_bytes // max(per_expert, 1)))
        self.dst, self.num_experts, self.start, self.puts = dst, num_experts, 0, 0
        self.cuda = gen_device.type == "cuda"
        shape = {k: (self.n, *t.shape[1:]) for k, t in dst.items()}
        self.drawn = {
            k: torch.empty(shape[k], dtype=t.dtype, device=gen_device) for k, t in dst.items()
        }
        self.pinned = {
            k: torch.empty(shape[k], dtype=t.dtype, device="cpu", pin_memory=self.cuda)
            for k, t in dst.items()
        }

    def put(self, key: str, e: int, t: torch.Tensor) -> None:
        self.drawn[key][e - self.start].copy_(t)
        self.puts += 1

    def expert_done(self, e: int) -> None:
        if e + 1 - self.start == self.n or e + 1 == self.num_experts:
            self._flush(e + 1)

    def _flush(self, end: int) -> None:
        m = end - self.start
        # every tensor of every expert in the chunk was drawn: nothing stale reaches the host
        assert self.puts == m * len(self.dst), (self.puts, m, sorted(self.dst))
        for k, buf in self.drawn.items():
            self.pinned[k][:m].copy_(buf[:m], non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.current_stream(next(iter(self.drawn.values())).device).synchronize()
        for k, buf in self.pinned.items():
            self.dst[k][self.start : end].copy_(buf[:m])
        self.start, self.puts = end, 0
