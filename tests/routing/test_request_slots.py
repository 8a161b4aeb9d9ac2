"""Per-request state rows: stable while a request is live, keys in first-seen order, rows
recycled least recently scheduled first, a scratch row apart, and a reset after warm-up."""

from __future__ import annotations

import pytest

from xinfer.runner.request_slots import RequestSlots, request_row_capacity


def test_rows_and_keys():
    slots = RequestSlots(3)
    assert [slots.assign(r) for r in ("a", "b", "a")] == [(0, 0), (1, 1), (0, 0)]
    assert slots.assign("c") == (2, 2)
    assert slots.scratch_row == 3
    # full: "d" takes the row of the least recently scheduled request ("b")
    assert slots.assign("d") == (1, 3)
    assert slots.assign("b") == (0, 4)  # back: a new row and key ("a" was the oldest)
    slots.reset()
    assert slots.assign("z") == (0, 0)


def test_capacity():
    assert request_row_capacity(64) >= 2 * 64
    with pytest.raises(ValueError):
        RequestSlots(0)
