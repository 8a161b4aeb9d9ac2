"""Streams tensors from a single-file or sharded safetensors checkpoint, shard by shard,
with a progress bar; only one tensor at a time is held beyond the memory map."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from xinfer.errors import UserError


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        files = sorted({d / f for f in read_weight_map(index).values()})
        absent = [f.name for f in files if not f.exists()]
        if absent:
            raise UserError(f"{index.name} lists shards that are missing: {', '.join(absent)}")
        return files
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise UserError(
            f"no *.safetensors weights in {str(d)!r}; convert the checkpoint or use "
            "--load-format dummy"
        )
    return files


def read_weight_map(index: Path) -> dict[str, str]:
    """The tensor → shard file map of a sharded checkpoint's index."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map", {})
    except (ValueError, AttributeError):
        weight_map = None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise UserError(
            f"{index.name} is not a valid index (a JSON object whose weight_map maps tensor "
            "names to shard files); download it again"
        )
    return weight_map


def iter_safetensors(
    model_dir: str | Path, show_progress: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    files = checkpoint_files(model_dir)
    total = sum(f.stat().st_size for f in files)
    with tqdm(
        total=total, unit="B", unit_scale=True, desc="Loading weights", disable=not show_progress
    ) as bar:
        for path in files:
            try:
                f = safe_open(str(path), framework="pt", device="cpu")
            except SafetensorError as e:
                raise UserError(
                    f"{str(path)!r} is not a complete safetensors file ({e}); download it again"
                ) from None
            with f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    tensor = f.get_tensor(key)
                    yield key, tensor
                    bar.update(tensor.numel() * tensor.element_size())
