"""Fixtures of the GGUF kernel tests run by Triton's interpreter (`*_interpret.py`): the
launchers with their kernels interpreted (`gl`) and the tile choices (`gt`, the module whose
switches a test patches). A file that means another launcher by `gl` defines its own."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def gl():
    """`kernels.gguf_launch`, its kernels interpreted (`interpreted_gguf_launch`)."""
    from gguf_interpret_cases import interpreted_gguf_launch

    return interpreted_gguf_launch()


@pytest.fixture(scope="module")
def gt():
    """`kernels.gguf_tiles`: the tiles and the word paths' switches."""
    from xinfer.kernels import gguf_tiles

    return gguf_tiles
