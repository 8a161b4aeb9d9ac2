"""bench/probe_packing.py runs the engine's packing path on CPU at a tiny shape (the GPU
figures come from the device; this keeps the probe from rotting)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import probe_packing  # noqa: E402
import pytest  # noqa: E402

from xinfer import host_memory  # noqa: E402


@pytest.mark.parametrize("extra", [[], ["--no-prefault"]], ids=["prefault", "no-prefault"])
def test_probe_packs_every_layer_and_reports_its_seconds(capsys, extra):
    mapped = host_memory._mapped
    out = probe_packing.main(
        ["--experts", "4", "--hidden", "64", "--intermediate", "32", "--layers", "2",
         "--device", "cpu", "--top", "5", *extra]
    )  # fmt: skip
    assert host_memory._mapped is mapped  # the A/B's patch is undone
    assert len(out["seconds"]) == 2 and all(s > 0 for s in out["seconds"])
    assert out["layer_gb"] == 4 * 3 * 64 * 32 * 2 / 1e9
    printed = capsys.readouterr().out
    assert printed.count(", 2 packed") == 2 and printed.count("fill: ") == 2
    assert "cumulative" in printed
