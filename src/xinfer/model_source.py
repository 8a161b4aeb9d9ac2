"""Where a model comes from: `--m` names the bundled demo, a local directory or file, or a
Hugging Face repo id (`org/name`). A repo id is looked up in the local hub cache first (no
network); if it is not there (or incomplete) it is downloaded with progress bars, unless
`HF_HUB_OFFLINE` is set, in which case the error says how to get it."""

from __future__ import annotations

import logging
import re
from importlib import resources
from pathlib import Path

from xinfer import envs
from xinfer.errors import UserError
from xinfer.weights.safetensors_index import indexed_shards

logger = logging.getLogger("xinfer")

# What an HF-layout checkpoint needs: configs, tokenizer and template, safetensors weights.
HUB_FILE_PATTERNS = ("*.json", "*.safetensors", "*.jinja", "*.model")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def demo_model_path() -> str:
    return str(resources.files("xinfer") / "assets" / "demo")


def is_repo_id(model: str) -> bool:
    """`org/name` that is not a local path (relative paths need `./` to be unambiguous)."""
    return bool(_REPO_ID.fullmatch(model)) and not Path(model).expanduser().exists()


def resolve_model(model: str | None) -> str:
    """The local path of `model` ('demo' or None: the bundled model)."""
    if model is None or model == "demo":
        path = demo_model_path()
        if not (Path(path) / "config.json").exists():
            raise UserError("the bundled demo model is missing from this install; pass --m PATH")
        return path
    if not model.strip():
        raise UserError(
            "--m is empty; give a model directory, a .gguf file, an org/name repo id or demo"
        )
    if is_repo_id(model):
        return hub_snapshot(model)
    return str(Path(model).expanduser())


def model_display_name(model: str | None, path: str) -> str:
    """The name the API shows: the repo id of a hub model, else the directory's name."""
    if model is not None and model != "demo" and is_repo_id(model):
        return model
    return Path(path).name


def is_complete_checkpoint(path: Path) -> bool:
    """config.json and every safetensors shard its index names (or one safetensors file)."""
    if not (path / "config.json").is_file():
        return False
    try:
        shards = indexed_shards(path)
    except UserError:  # a damaged index: download it again
        return False
    if shards is not None:
        return all(shard.is_file() for shard in shards)
    return any(path.glob("*.safetensors"))


def hub_snapshot(repo_id: str) -> str:
    """The local snapshot directory of `repo_id`: from the cache, else downloaded."""
    import httpx
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub import errors as hub_errors

    cache = constants.HF_HUB_CACHE
    # Newer clients say "cached but missing files" with their own error; older ones do not.
    not_cached = (
        hub_errors.LocalEntryNotFoundError,
        getattr(hub_errors, "IncompleteSnapshotError", hub_errors.LocalEntryNotFoundError),
    )
    try:
        path = snapshot_download(
            repo_id, allow_patterns=list(HUB_FILE_PATTERNS), local_files_only=True
        )
        if is_complete_checkpoint(Path(path)):
            return path
    except not_cached:
        pass  # not cached (or partly): download below
    if envs.HF_HUB_OFFLINE() or constants.HF_HUB_OFFLINE:
        raise UserError(
            f"{repo_id!r} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set; "
            f"download it first (hf download {repo_id}), unset HF_HUB_OFFLINE, or pass a "
            "local directory"
        )
    logger.info("downloading %s from the Hugging Face hub into %s", repo_id, cache)
    try:
        path = snapshot_download(repo_id, allow_patterns=list(HUB_FILE_PATTERNS))
    except hub_errors.GatedRepoError:
        raise UserError(
            f"{repo_id!r} is gated: accept its license on huggingface.co and set HF_TOKEN"
        ) from None
    except hub_errors.RepositoryNotFoundError:
        raise UserError(
            f"no model {repo_id!r} on the Hugging Face hub (if it is private, set HF_TOKEN); "
            "for a local directory, check the path"
        ) from None
    except hub_errors.HfHubHTTPError as e:
        raise UserError(f"the Hugging Face hub refused {repo_id!r}: {e}") from None
    except (
        *not_cached,
        hub_errors.OfflineModeIsEnabled,
        httpx.TransportError,
        OSError,
    ) as e:
        raise UserError(
            f"could not download {repo_id!r} from the Hugging Face hub ({type(e).__name__}); "
            "check the network, or download it elsewhere into the cache"
        ) from None
    if not is_complete_checkpoint(Path(path)):
        raise UserError(
            f"{repo_id!r} has no config.json with safetensors weights; xinfer loads HF-layout "
            "checkpoints (for a GGUF repo, download the .gguf file and pass its path)"
        )
    return path
