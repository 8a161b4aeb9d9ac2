"""How the quantized prefill path numbers a call's ids (`quant_prefill.id_bound`,
`compact_ids`): plain torch, no kernel. The chunks cover the numbers, so their count follows
the ids a call can use, not the rows of the set (an offload slot view's rows)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from xinfer.kernels import quant_prefill  # noqa: E402


def test_the_bound_is_the_pairs_or_the_callers_promise():
    assert quant_prefill.id_bound(3338, 16384) == 3338  # a 2k prefill on layer 0's view
    assert quant_prefill.id_bound(3338, 16384, max_ids=128) == 128  # ... of 128 experts
    assert quant_prefill.id_bound(3338, 1024, max_ids=128) == 128
    assert quant_prefill.id_bound(128, 56, max_ids=128) == 56  # one id a pair at most
    assert quant_prefill.id_bound(128, 16384) == 128  # resident


def test_used_ids_are_numbered_in_id_order():
    ids = torch.tensor([[40, 3], [3, 7], [40, 40]], dtype=torch.int32)
    experts, local = quant_prefill.compact_ids(ids, 50, 4)
    assert experts.tolist() == [3, 7, 40, -1]
    assert local.dtype == torch.int32 and local.tolist() == [[2, 0], [0, 1], [2, 2]]


def test_a_set_no_larger_than_the_bound_keeps_its_ids():
    ids = torch.tensor([[4, 1], [1, 0]], dtype=torch.int32)
    experts, local = quant_prefill.compact_ids(ids, 6, 6)
    assert experts.tolist() == [0, 1, -1, -1, 4, -1] and local is ids


def test_a_broken_promise_leaves_pairs_out_and_stays_in_bounds():
    ids = torch.tensor([[40, 3], [3, 7]], dtype=torch.int32)
    experts, local = quant_prefill.compact_ids(ids, 50, 2)
    assert experts.tolist() == [3, 7] and local.tolist() == [[-1, 0], [0, 1]]
