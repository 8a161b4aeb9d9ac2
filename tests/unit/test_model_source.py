"""Models by name: `--m org/name` is found in a (fake, local) Hugging Face cache without the
network, `HF_HUB_OFFLINE` stops a download with a clear error, a missing or incomplete
model is downloaded (the hub client is replaced by a fake here: tests have no network), and
the hub's errors become one sentence each."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import huggingface_hub
import pytest
from huggingface_hub import constants
from huggingface_hub import errors as hub_errors

from xinfer.errors import UserError
from xinfer.model_source import (
    demo_model_path,
    is_complete_checkpoint,
    is_repo_id,
    model_display_name,
    resolve_model,
)

SHA = "0123456789abcdef0123456789abcdef01234567"


def add_to_cache(cache: Path, repo_id: str, files_from: str | None = None) -> Path:
    """Lay out `repo_id` as huggingface_hub caches it: refs/main → snapshots/<sha>/files."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    for f in Path(files_from or demo_model_path()).iterdir():
        shutil.copy(f, snapshot / f.name)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return cache


@pytest.fixture
def no_network(monkeypatch):
    """Fail the test if the hub client would go online."""
    real = huggingface_hub.snapshot_download

    def cache_only(repo_id, **kw):
        assert kw.get("local_files_only"), "went to the network"
        return real(repo_id, **kw)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", cache_only)


def test_repo_ids_and_paths(tmp_path, monkeypatch):
    assert is_repo_id("Qwen/Qwen3-30B-A3B") and is_repo_id("org/name.v2")
    assert not is_repo_id("/abs/dir") and not is_repo_id("./org/name") and not is_repo_id("a")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not is_repo_id("org/name")  # an existing local directory wins
    assert resolve_model("org/name") == "org/name"
    assert model_display_name("Qwen/Qwen3-30B-A3B", "/x/snapshots/abc") == "Qwen/Qwen3-30B-A3B"
    assert model_display_name("/models/OLMoE", "/models/OLMoE") == "OLMoE"


def test_a_directory_of_a_gguf_file_names_the_file(tmp_path):
    """--m at the directory of a .gguf file: the error says to pass the file itself."""
    from xinfer.config import ModelConfig

    (tmp_path / "model-Q4_K_M.gguf").write_bytes(b"GGUF")
    with pytest.raises(UserError, match=r"has no config\.json; .*model-Q4_K_M\.gguf"):
        ModelConfig.from_dir(tmp_path)


def test_cached_model_resolves_without_network(hub_cache, no_network):
    snapshot = add_to_cache(hub_cache, "org/tiny")
    assert Path(resolve_model("org/tiny")) == snapshot


def test_offline_and_not_cached_is_one_sentence(hub_cache, no_network, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="not in the Hugging Face cache .* HF_HUB_OFFLINE is set"):
        resolve_model("org/missing")


def test_incomplete_cache_is_downloaded(hub_cache, monkeypatch):
    snapshot = add_to_cache(hub_cache, "org/tiny")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    assert not is_complete_checkpoint(snapshot)
    calls = []

    def fake_download(repo_id, **kw):
        calls.append(kw.get("local_files_only", False))
        if not kw.get("local_files_only"):  # "downloads" the missing shard
            (snapshot / "model-00001-of-00002.safetensors").write_bytes(b"")
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve_model("org/tiny") == str(snapshot)
    assert calls == [True, False]  # the cache first, then the download
    assert is_complete_checkpoint(snapshot)


@pytest.mark.parametrize(
    "text", ["{bad", "[1, 2]", "{}", '{"weight_map": 5}', '{"weight_map": {"a": null}}']
)
def test_a_damaged_index_is_an_incomplete_snapshot(tmp_path, text):
    """Read by the loader's parser: a damaged index means download again (a weight_map of
    non-names raised a TypeError here)."""
    snapshot = Path(shutil.copytree(demo_model_path(), tmp_path / "snapshot"))
    assert is_complete_checkpoint(snapshot)
    (snapshot / "model.safetensors.index.json").write_text(text)
    assert not is_complete_checkpoint(snapshot)


def _response(status: int) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/x"))


@pytest.mark.parametrize(
    "error, needle",
    [
        (hub_errors.RepositoryNotFoundError("nope", response=_response(404)), "no model"),
        (hub_errors.GatedRepoError("gated", response=_response(403)), "is gated"),
        (hub_errors.LocalEntryNotFoundError("no connection"), "could not download"),
        (httpx.ConnectError("refused"), "could not download"),
        (hub_errors.HfHubHTTPError("boom", response=_response(500)), "refused"),
    ],
)
def test_hub_errors_are_one_sentence(hub_cache, monkeypatch, error, needle):
    def fake_download(repo_id, **kw):
        if kw.get("local_files_only"):
            raise hub_errors.LocalEntryNotFoundError("not cached")
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    with pytest.raises(UserError, match=needle):
        resolve_model("org/name")


def test_a_repo_without_hf_weights_is_refused(hub_cache, monkeypatch, tmp_path):
    empty = tmp_path / "gguf_only"
    empty.mkdir()
    (empty / "model-Q4_K_M.gguf").write_bytes(b"")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(empty))
    with pytest.raises(UserError, match="no config.json with safetensors"):
        resolve_model("org/gguf")


def test_cli_runs_a_cached_model_by_name(tmp_path):
    """The whole path in a fresh process: HF_HUB_CACHE and HF_HUB_OFFLINE as users set them."""
    add_to_cache(tmp_path / "hub", "org/tiny")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin"}
    env["PYTHONPATH"] = ":".join(sys.path)
    cmd = [sys.executable, "-m", "xinfer.cli", "--d", "cpu", "--max-tokens", "4"]
    ok = subprocess.run(
        [*cmd, "--m", "org/tiny", "--prompt", "def f(x):"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "4 tokens" in ok.stderr
    missing = subprocess.run(
        [*cmd, "--m", "org/missing", "--prompt", "x"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "HF_HUB_OFFLINE is set" in missing.stderr
