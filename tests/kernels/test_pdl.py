"""Programmatic dependent launch's switch (`xinfer.kernels.pdl`) off the GPU: nothing is
asked of a launch on CPU tensors whatever the switch says (the interpreter has no PDL and
the kernels' USE_PDL stays False), and `XINFER_PDL` takes 1/0 or is refused in one sentence.
On the GPU: tests/kernels/test_pdl_gpu.py."""

from __future__ import annotations

import pytest
import torch

from xinfer import UserError, envs
from xinfer.kernels import pdl


def test_no_pdl_options_off_the_gpu(monkeypatch):
    t = torch.zeros(2)
    assert pdl.options(t) == {}
    monkeypatch.setattr(pdl, "ENABLED", True)
    assert pdl.options(t) == {}


def test_xinfer_pdl_values(monkeypatch):
    monkeypatch.delenv("XINFER_PDL", raising=False)
    assert envs.XINFER_PDL() is True  # on by default (timed: bench/NOTES.md, thirtieth session)
    for raw, want in (("1", True), ("on", True), ("0", False), (" ", True)):
        monkeypatch.setenv("XINFER_PDL", raw)
        assert envs.XINFER_PDL() is want
    monkeypatch.setenv("XINFER_PDL", "fast")
    with pytest.raises(UserError, match="^XINFER_PDL must be 1 or 0, got 'fast'$"):
        envs.XINFER_PDL()


def test_engine_start_reads_xinfer_pdl(monkeypatch, tmp_path):
    """The variable is read when an engine starts (a launch reads only the module flag); a bad
    value stops the start with one sentence before loading."""
    from tiny_models import make_hf_model, write_checkpoint

    from xinfer import LLM

    path = str(write_checkpoint(make_hf_model("mixtral"), tmp_path))
    monkeypatch.setattr(pdl, "ENABLED", False)
    monkeypatch.setenv("XINFER_PDL", "1")
    LLM(path, device="cpu")
    assert pdl.ENABLED is True
    monkeypatch.setenv("XINFER_PDL", "0")
    LLM(path, device="cpu")
    assert pdl.ENABLED is False
    monkeypatch.setenv("XINFER_PDL", "sometimes")
    with pytest.raises(UserError, match="XINFER_PDL must be 1 or 0"):
        LLM(path, device="cpu")


def test_early_release_only_where_asked_and_switched_on(monkeypatch):
    """PDL_RELEASE_FIRST goes only to launches that take it (`release_first`), only while
    EARLY_RELEASE is on, and only with PDL itself (sm_90+ CUDA, ENABLED)."""
    from types import SimpleNamespace

    cuda_t = SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(pdl, "_hopper_or_later", lambda index: True)
    monkeypatch.setattr(pdl, "ENABLED", True)
    monkeypatch.setattr(pdl, "EARLY_RELEASE", False)
    assert pdl.options(cuda_t, release_first=True) == {"USE_PDL": True, "launch_pdl": True}
    monkeypatch.setattr(pdl, "EARLY_RELEASE", True)
    assert pdl.options(cuda_t) == {"USE_PDL": True, "launch_pdl": True}
    assert pdl.options(cuda_t, release_first=True) == {
        "USE_PDL": True, "launch_pdl": True, "PDL_RELEASE_FIRST": True
    }  # fmt: skip
    assert pdl.options(torch.zeros(2), release_first=True) == {}  # CPU: nothing
    monkeypatch.setattr(pdl, "_hopper_or_later", lambda index: False)
    assert pdl.options(cuda_t, release_first=True) == {}  # before sm_90: no PDL at all
    monkeypatch.setattr(pdl, "_hopper_or_later", lambda index: True)
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert pdl.options(cuda_t, release_first=True) == {}


def test_xinfer_pdl_early_release_values_and_engine_start(monkeypatch, tmp_path):
    from tiny_models import make_hf_model, write_checkpoint

    from xinfer import LLM

    monkeypatch.delenv("XINFER_PDL_EARLY_RELEASE", raising=False)
    assert envs.XINFER_PDL_EARLY_RELEASE() is False  # off until timed
    monkeypatch.setenv("XINFER_PDL_EARLY_RELEASE", "maybe")
    with pytest.raises(UserError, match="^XINFER_PDL_EARLY_RELEASE must be 1 or 0, got 'maybe'$"):
        envs.XINFER_PDL_EARLY_RELEASE()
    path = str(write_checkpoint(make_hf_model("mixtral"), tmp_path))
    monkeypatch.setattr(pdl, "EARLY_RELEASE", False)
    monkeypatch.setenv("XINFER_PDL_EARLY_RELEASE", "1")
    LLM(path, device="cpu")
    assert pdl.EARLY_RELEASE is True
    monkeypatch.setenv("XINFER_PDL_EARLY_RELEASE", "0")
    LLM(path, device="cpu")
    assert pdl.EARLY_RELEASE is False
