"""Fixtures of the offload tests: no `XINFER_MOE_OFFLOAD*` variable from the caller's
environment reaches a test (each sets what it means), and a tiny Mixtral checkpoint per
module (`ckpt`; a module may define its own)."""

from __future__ import annotations

import pytest
from tiny_models import make_hf_model, write_checkpoint


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for suffix in ("", "_RESERVE_GB", "_PROFILE"):
        monkeypatch.delenv("XINFER_MOE_OFFLOAD" + suffix, raising=False)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_checkpoint(make_hf_model("mixtral"), tmp_path_factory.mktemp("mixtral")))
