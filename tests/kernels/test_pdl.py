"""Programmatic dependent launch's switch (`xinfer.kernels.pdl`) off the GPU: nothing is
asked of a launch on CPU tensors whatever the switch says (the interpreter has no PDL and
the kernels' USE_PDL stays False), and `XINFER_PDL` takes 1/0 or is refused in one sentence.
The L2 weight prefetch's switch (`prefetch_options`): off by default, on only with
PREFETCH_WEIGHTS, PDL on an sm_90 GPU (mocked) and 16-byte rows; `XINFER_PDL_PREFETCH` read
as `XINFER_PDL`. On the GPU: tests/kernels/test_pdl_gpu.py, test_prefetch_l2_gpu.py."""

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


def _assert_switch_values(monkeypatch, name: str, default: bool) -> None:
    """`envs.<name>`: `default` unset or blank, 1 / on and 0, and any other value refused in
    one sentence."""
    read = getattr(envs, name)
    monkeypatch.delenv(name, raising=False)
    assert read() is default
    for raw, want in (("1", True), ("on", True), ("0", False), (" ", default)):
        monkeypatch.setenv(name, raw)
        assert read() is want
    monkeypatch.setenv(name, "fast")
    with pytest.raises(UserError, match=f"^{name} must be 1 or 0, got 'fast'$"):
        read()


def _assert_engine_start_reads(monkeypatch, tmp_path, name: str, flag: str, off) -> None:
    """`name` is read into `pdl.<flag>` when an engine starts: 1 sets it, `off` (a value, or
    None: unset) clears it, and a bad value stops the start with one sentence before
    loading."""
    from tiny_models import make_hf_model, write_checkpoint

    from xinfer import LLM

    path = str(write_checkpoint(make_hf_model("mixtral"), tmp_path))
    monkeypatch.setattr(pdl, flag, False)
    monkeypatch.setenv(name, "1")
    LLM(path, device="cpu")
    assert getattr(pdl, flag) is True
    if off is None:
        monkeypatch.delenv(name)
    else:
        monkeypatch.setenv(name, off)
    LLM(path, device="cpu")
    assert getattr(pdl, flag) is False
    monkeypatch.setenv(name, "sometimes")
    with pytest.raises(UserError, match=f"{name} must be 1 or 0"):
        LLM(path, device="cpu")


def test_xinfer_pdl_values(monkeypatch):
    # on by default (timed: bench/NOTES.md, thirtieth session)
    _assert_switch_values(monkeypatch, "XINFER_PDL", default=True)


def test_engine_start_reads_xinfer_pdl(monkeypatch, tmp_path):
    """The variable is read when an engine starts (a launch reads only the module flag); a bad
    value stops the start with one sentence before loading."""
    _assert_engine_start_reads(monkeypatch, tmp_path, "XINFER_PDL", "ENABLED", off="0")


class _Weight:
    """What `prefetch_options` reads of a tensor, set at will (no CUDA here)."""

    def __init__(self, ptr=4096, stride=1024, size=2, dims=2, device="cuda"):
        self.device = torch.device(device, 0) if device == "cuda" else torch.device(device)
        self._ptr, self._stride, self._size, self._dims = ptr, stride, size, dims

    def data_ptr(self):
        return self._ptr

    def stride(self, dim):
        assert dim == 0
        return self._stride

    def element_size(self):
        return self._size

    def dim(self):
        return self._dims


@pytest.fixture
def sm(monkeypatch):
    """Set the (mocked) GPU's compute capability: sm(9, 0)."""

    def set_capability(major: int, minor: int = 0) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (major, minor))
        pdl._hopper_or_later.cache_clear()

    yield set_capability
    pdl._hopper_or_later.cache_clear()


def test_prefetch_options_off_by_default(monkeypatch, sm):
    """Off until timed on a GPU: nothing even where PDL and the alignment allow it."""
    assert pdl.PREFETCH_WEIGHTS is False
    sm(9, 0)
    monkeypatch.setattr(pdl, "ENABLED", True)
    assert pdl.options(_Weight()) == {"USE_PDL": True, "launch_pdl": True}
    assert pdl.prefetch_options(_Weight()) == {}


def test_prefetch_options_on_only_with_pdl_sm90_and_alignment(monkeypatch, sm):
    sm(9, 0)
    monkeypatch.setattr(pdl, "ENABLED", True)
    monkeypatch.setattr(pdl, "PREFETCH_WEIGHTS", True)
    assert pdl.prefetch_options(_Weight()) == {"PREFETCH_L2": True}
    assert pdl.prefetch_options(_Weight(), "PREFETCH_S") == {"PREFETCH_S": True}
    # bf16 rows of 8 elements (16 bytes), uint8 block rows of 1,152 bytes (Q4_K, K 2,048)
    assert pdl.prefetch_options(_Weight(stride=8)) == {"PREFETCH_L2": True}
    assert pdl.prefetch_options(_Weight(stride=1152, size=1)) == {"PREFETCH_L2": True}
    for weight in (
        _Weight(ptr=4096 + 8),  # base off 16 bytes
        _Weight(stride=1680 + 4, size=1),  # rows of 1,684 bytes
        _Weight(stride=13, size=4),  # 52-byte rows
        _Weight(stride=1, size=4),  # an (N, 1) float32 scale: 4-byte rows
        _Weight(dims=1),  # not a matrix of rows
        _Weight(device="cpu"),  # no PDL off the GPU
    ):
        assert pdl.prefetch_options(weight) == {}, vars(weight)
    monkeypatch.setattr(pdl, "ENABLED", False)  # PDL off: no wait to overlap
    assert pdl.prefetch_options(_Weight()) == {}
    monkeypatch.setattr(pdl, "ENABLED", True)
    sm(8, 0)  # no PDL before sm_90
    assert pdl.options(_Weight()) == {}
    assert pdl.prefetch_options(_Weight()) == {}


def test_prefetch_options_off_the_gpu(monkeypatch):
    monkeypatch.setattr(pdl, "PREFETCH_WEIGHTS", True)
    assert pdl.prefetch_options(torch.zeros(4, 64)) == {}
    assert pdl.prefetch_aligned(torch.zeros(4, 64))  # (the alignment alone would allow it)
    assert not pdl.prefetch_aligned(torch.zeros(4, 65, dtype=torch.uint8))
    assert not pdl.prefetch_aligned(torch.zeros(4, 64)[:, 1:])  # base 4 bytes in


def test_xinfer_pdl_prefetch_values(monkeypatch):
    # off until timed on a GPU
    _assert_switch_values(monkeypatch, "XINFER_PDL_PREFETCH", default=False)


def test_engine_start_reads_xinfer_pdl_prefetch(monkeypatch, tmp_path):
    """Read when an engine starts, as XINFER_PDL (unset: off); a bad value stops the start."""
    _assert_engine_start_reads(
        monkeypatch, tmp_path, "XINFER_PDL_PREFETCH", "PREFETCH_WEIGHTS", off=None
    )
