"""Where a model comes from: `--m` names the bundled demo, a local directory, or (later in
this module) a Hugging Face repo id resolved through the local hub cache or a download."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from xinfer.errors import UserError


def demo_model_path() -> str:
    return str(resources.files("xinfer") / "assets" / "demo")


def resolve_model(model: str | None) -> str:
    """The local directory of `model` ('demo' or None: the bundled model)."""
    if model is None or model == "demo":
        path = demo_model_path()
        if not (Path(path) / "config.json").exists():
            raise UserError("the bundled demo model is missing from this install; pass --m PATH")
        return path
    return model
