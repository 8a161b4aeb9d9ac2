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
