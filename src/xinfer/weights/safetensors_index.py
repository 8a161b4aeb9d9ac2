"""The index of a sharded safetensors checkpoint (`model.safetensors.index.json`): which shard
file holds each tensor. Read here only, by the weight loader and by `model_source` (whether a
cached hub snapshot is complete); torch-free, so `model_source` loads no weight reader."""

from __future__ import annotations

import json
from pathlib import Path

from xinfer.errors import UserError

INDEX_FILE = "model.safetensors.index.json"


def read_weight_map(index: Path) -> dict[str, str]:
    """The tensor → shard file map of a sharded checkpoint's index; a damaged index (not
    JSON, no object, no weight_map, or one that maps to anything but file names) is a
    UserError."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError):
        weight_map = None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise UserError(
            f"{index.name} is not a valid index (a JSON object whose weight_map maps tensor "
            "names to shard files); download it again"
        )
    return weight_map


def indexed_shards(model_dir: Path) -> list[Path] | None:
    """The shard files the index in `model_dir` names (whether there or not), sorted; None
    when there is no index."""
    index = model_dir / INDEX_FILE
    if not index.is_file():
        return None
    return sorted({model_dir / f for f in read_weight_map(index).values()})
