"""`--d` with several devices: the device list (or torchrun's environment) → this process's
device and a `ParallelConfig`, validated before any rank starts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xinfer import envs
from xinfer.errors import UserError

LAUNCHERS = ("spawn", "torchrun")


@dataclass(frozen=True)
class ParallelConfig:
    """`size` ranks; this process is `rank`. `devices`: one per rank started on this host
    ("spawn": rank 0 starts the others; "torchrun": the launcher started every rank and
    `devices` lists this node's, indexed by the local rank)."""

    size: int = 1
    rank: int = 0
    devices: tuple[str, ...] = ()
    launcher: str = "spawn"

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} of {self.size} is out of range")
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, got {self.launcher!r}")
        if self.size > 1 and self.launcher == "spawn" and len(self.devices) != self.size:
            raise ValueError("a spawned tensor-parallel run needs one device per rank")

    @property
    def is_enabled(self) -> bool:
        return self.size > 1


def _one_device(entry: str) -> str:
    """ "cpu", "N" or "cuda:N" → "cpu" / "cuda:N" (existence is checked for the whole list)."""
    d = entry.strip()
    if d.isdigit():
        return f"cuda:{d}"
    if d == "cuda":
        return "cuda:0"
    if d == "cpu" or (d.startswith("cuda:") and d[5:].isdigit()):
        return d
    raise UserError(f"unknown device {entry!r} in --d; use cpu, a GPU index or cuda:N")


def _check_devices(devices: list[str]) -> None:
    kinds = {d.split(":")[0] for d in devices}
    if len(kinds) > 1:
        raise UserError("--d mixes CPU and GPU devices; tensor parallelism needs one kind")
    if kinds == {"cpu"}:
        return
    dupes = sorted({d for d in devices if devices.count(d) > 1})
    if dupes:
        raise UserError(f"--d lists {dupes[0]} twice; every GPU rank needs its own GPU")
    if not torch.cuda.is_available():
        raise UserError(f"--d {','.join(devices)} asks for GPUs, but this machine has no CUDA GPU")
    visible = torch.cuda.device_count()
    missing = [d for d in devices if int(d.split(":")[1]) >= visible]
    if missing:
        raise UserError(
            f"--d asks for {len(devices)} GPUs ({', '.join(devices)}) but {missing[0]} does not "
            f"exist ({visible} visible); give at most {visible} devices"
        )


def parse_devices(value: str | None) -> list[str]:
    """A comma list of devices; `None` → GPU 0 if present, else the CPU."""
    if value is None or "," not in str(value):  # one device: the single-device rules
        from xinfer.args import parse_device

        return [parse_device(value)]
    devices = [_one_device(e) for e in str(value).split(",") if e.strip()]
    if not devices:
        raise UserError(f"--d {value!r} names no device")
    _check_devices(devices)
    return devices


def resolve_parallel(value: str | None) -> tuple[str, ParallelConfig]:
    """This process's device and the parallel config, from `--d` and, when torchrun started
    us, its RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE."""
    run = envs.torchrun_ranks()
    if run is None:
        devices = parse_devices(value)
        if len(devices) == 1:
            return devices[0], ParallelConfig()
        return devices[0], ParallelConfig(size=len(devices), devices=tuple(devices))
    if value is None:
        kind = "cuda" if torch.cuda.is_available() else "cpu"
        value = ",".join(kind if kind == "cpu" else str(i) for i in range(run.local_world_size))
    devices = parse_devices(value)
    if len(devices) != run.local_world_size:
        raise UserError(
            f"torchrun starts {run.local_world_size} processes on this node but --d lists "
            f"{len(devices)} devices; give one device per local process"
        )
    config = ParallelConfig(
        size=run.world_size, rank=run.rank, devices=tuple(devices), launcher="torchrun"
    )
    return devices[run.local_rank], config
