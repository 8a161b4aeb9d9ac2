"""Host store: every routed-expert tensor of every MoE layer (any set of `[E, ...]` tensors,
any dtype, or bf16 ones packed by offload/packed.py) in host RAM, pinned *after* it was
filled with `cudaHostRegister` (mapped, portable) so that kernels read it zero-copy through
UVA and the copy engine moves it async. On CPU "host" and "device" are one memory and
nothing is pinned. A store closed (or collected) while a CUDA graph is being captured
unregisters later: the capture forbids the call, and making it would break the capture."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from xinfer.config import ModelConfig
from xinfer.errors import UserError
from xinfer.host_memory import MIN_BYTES, copy_to_mapping, owns_mapping
from xinfer.offload.packed import PackedExperts

logger = logging.getLogger("xinfer")

GIB = 1 << 30
PAGE = 4096
_HOST_REGISTER_PORTABLE = 0x01
_HOST_REGISTER_MAPPED = 0x02
_RAM_MARGIN_BYTES = 1 * GIB  # left for the process itself
# Page-rounded [start, end) byte ranges registered by any store in this process: CUDA
# refuses to register a page twice, so a tensor sharing a page with one is copied instead.
_REGISTERED: list[tuple[int, int]] = []
# Registrations whose store closed during a graph capture: (ptr, nbytes, the tensors kept
# alive until then), dropped at the next pin or close outside a capture.
_DEFERRED: list[tuple[int, int, object]] = []


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _unregister(ptr: int, nbytes: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(ptr)
    start = ptr // PAGE * PAGE
    end = -(-(ptr + nbytes) // PAGE) * PAGE
    if (start, end) in _REGISTERED:
        _REGISTERED.remove((start, end))


def unregister_deferred() -> None:
    """Drop the registrations deferred by a capture (a no-op while one still runs)."""
    if _DEFERRED and not _capturing():
        pending = list(_DEFERRED)
        _DEFERRED.clear()
        for ptr, nbytes, _ in pending:
            _unregister(ptr, nbytes)


def available_host_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_host_ram(needed_bytes: int, what: str = "the offloaded experts") -> None:
    """Fail early, with a fix, when host RAM cannot hold `needed_bytes` more."""
    avail = available_host_bytes()
    if avail is not None and needed_bytes + _RAM_MARGIN_BYTES > avail:
        raise UserError(
            f"{what} need {needed_bytes / GIB:.1f} GB of host RAM but only {avail / GIB:.1f} GB "
            "is available; free memory, use a machine with more RAM, or a smaller (quantized) model"
        )


def expert_host_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of every routed expert of every MoE layer (what the host store will hold)."""
    return cfg.expert_bytes(dtype) * cfg.num_experts * len(cfg.moe_layer_ids)


def check_host_ram_for_experts(cfg: ModelConfig, dtype: torch.dtype) -> None:
    """The pre-load check: call before the experts are read from the checkpoint."""
    check_host_ram(expert_host_bytes(cfg, dtype))


def _page_range(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr() // PAGE * PAGE
    end = -(-(t.data_ptr() + t.numel() * t.element_size()) // PAGE) * PAGE
    return start, end


def _overlaps_registered(start: int, end: int) -> bool:
    return any(s < end and start < e for s, e in _REGISTERED)


def _register(t: torch.Tensor, flags: int) -> None:
    """cudaHostRegister `t`'s bytes; a refusal (locked-memory limit, RAM) is the user's to
    fix: one sentence, and the start stops."""
    nbytes = t.numel() * t.element_size()
    err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, flags)
    if int(err) != 0:
        raise UserError(
            f"pinning {nbytes / GIB:.2f} GB of expert memory failed (CUDA error "
            f"{int(err)}); free host RAM or raise the locked-memory limit (ulimit -l)"
        )


class HostExpertStore:
    """Per layer: name → `[E, ...]` host tensor, or its packing (offload/packed.py), pinned
    and mapped on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.layers: list[dict[str, torch.Tensor | PackedExperts]] = []
        self._registered: list[tuple[int, int]] = []  # (ptr, nbytes) to unregister

    @property
    def is_pinned(self) -> bool:
        return self.device.type == "cuda"

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for layer in self.layers for t in layer.values())

    def layer_bytes(self, index: int) -> int:
        return sum(t.nbytes for t in self.layers[index].values())

    def add_layer(
        self, tensors: dict[str, torch.Tensor | PackedExperts]
    ) -> dict[str, torch.Tensor | PackedExperts]:
        """Take a filled layer's expert tensors or packings (on the host); returns the
        stored set."""
        stored = {}
        for name, t in tensors.items():
            if isinstance(t, PackedExperts):
                stored[name] = t.with_planes({k: self._keep(name, p) for k, p in t.planes.items()})
            else:
                stored[name] = self._keep(name, t)
        self.layers.append(stored)
        return stored

    def _keep(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu":
            raise ValueError(f"expert tensor {name!r} must be on the host, not {t.device}")
        t = t.contiguous()
        if not self.is_pinned or self._holds(t):
            return t
        if t.numel() * t.element_size() >= MIN_BYTES and not owns_mapping(t):
            t = copy_to_mapping(t)  # huge pages for what the link reads (xinfer/host_memory.py)
        return self.pin_after_fill(t)

    def pin_after_fill(self, t: torch.Tensor) -> torch.Tensor:
        """Register a filled host tensor as pinned, device-mapped memory (in place if its
        pages are its own, else a copy in a mapping of its own); returns the pinned tensor."""
        unregister_deferred()
        if _overlaps_registered(*_page_range(t)):
            t = copy_to_mapping(t)
        nbytes = t.numel() * t.element_size()
        if nbytes == 0:
            return t
        _register(t, _HOST_REGISTER_PORTABLE | _HOST_REGISTER_MAPPED)
        self._registered.append((t.data_ptr(), nbytes))
        _REGISTERED.append(_page_range(t))
        return t

    def unpin(self, t: torch.Tensor) -> None:
        """Undo `pin_after_fill` for a tensor the store will not keep (a packing declined
        after its planes were pinned)."""
        ptr, nbytes = t.data_ptr(), t.numel() * t.element_size()
        if (ptr, nbytes) in self._registered:
            self._registered.remove((ptr, nbytes))
            _unregister(ptr, nbytes)

    def _holds(self, t: torch.Tensor) -> bool:
        """`t` is exactly a tensor this store pinned already (packed planes are pinned when
        allocated, so that the packing's copies into them run at DMA speed)."""
        ptr, nbytes = t.data_ptr(), t.numel() * t.element_size()
        return any(p == ptr and n == nbytes for p, n in self._registered)

    @contextmanager
    def pinned_for_copies(self, tensors: Iterable[torch.Tensor]) -> Iterator[None]:
        """Pin host tensors that own their pages for the duration of a block of copies to
        the device (the packing's uploads: direct DMA instead of torch's pageable staging),
        unpinned after the device is done with them. Tensors that do not own their pages stay
        pageable: their copies are slower, never wrong."""
        done = []
        try:
            for t in tensors if self.is_pinned else ():
                nbytes = t.numel() * t.element_size()
                if nbytes == 0 or not owns_mapping(t) or _overlaps_registered(*_page_range(t)):
                    continue
                _register(t, 0)
                done.append(t.data_ptr())
            yield
        finally:
            if done:
                torch.cuda.synchronize(self.device)
                for ptr in done:
                    torch.cuda.cudart().cudaHostUnregister(ptr)

    def close(self) -> None:
        """Unregister the pinned memory (before the tensors are freed)."""
        if not self._registered:
            return
        if _capturing():
            _DEFERRED.extend((ptr, nbytes, self.layers) for ptr, nbytes in self._registered)
        else:
            unregister_deferred()
            for ptr, nbytes in self._registered:
                _unregister(ptr, nbytes)
        self._registered = []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: CUDA may already be gone
            pass
