"""Streams tensors from a single-file or sharded safetensors checkpoint, shard by shard,
with a progress bar; only one tensor at a time is held beyond the memory map."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from xinfer.errors import UserError
from xinfer.weights.safetensors_index import INDEX_FILE, indexed_shards


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    d = Path(model_dir)
    files = indexed_shards(d)
    if files is not None:
        absent = [f.name for f in files if not f.exists()]
        if absent:
            raise UserError(f"{INDEX_FILE} lists shards that are missing: {', '.join(absent)}")
        return files
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise UserError(
            f"no *.safetensors weights in {str(d)!r}; convert the checkpoint or use "
            "--load-format dummy"
        )
    return files


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
