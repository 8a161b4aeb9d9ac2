"""The dequantize twins equal the `gguf` package's dequantizers bit for bit, for every
block type we run, on random valid blocks (random bits, finite scales)."""

from __future__ import annotations

import gguf
import gguf_files as gf
import numpy as np
import pytest
import torch

from xinfer.quant.gguf_blocks import BLOCK_TYPES, block_type, dequantize


@pytest.mark.parametrize("name", sorted(BLOCK_TYPES))
@pytest.mark.parametrize("rows,row_len", [(3, 256), (7, 768), (1, 2048)])
def test_twin_equals_gguf_package_bit_for_bit(name, rows, row_len):
    rng = np.random.default_rng(hash((name, rows, row_len)) % 2**32)
    raw = gf.random_blocks(name, rows, row_len, rng)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])
    got = dequantize(torch.from_numpy(np.ascontiguousarray(raw)), BLOCK_TYPES[name], row_len)
    assert got.dtype == torch.float32 and tuple(got.shape) == ref.shape
    assert np.isfinite(ref).all()
    assert np.array_equal(got.numpy().view(np.uint32), ref.astype(np.float32).view(np.uint32))


def test_stacked_expert_rows_dequantize_per_row():
    rng = np.random.default_rng(1)
    raw = torch.from_numpy(gf.random_blocks("Q4_K", 4 * 6, 512, rng)).view(4, 6, -1)
    bt = block_type("q4_k")
    full = dequantize(raw, bt, 512)
    assert torch.equal(full[2], dequantize(raw[2], bt, 512))


def test_wrong_row_bytes_and_unknown_type_are_refused():
    with pytest.raises(ValueError, match="bytes"):
        dequantize(torch.zeros(2, 33, dtype=torch.uint8), BLOCK_TYPES["Q8_0"], 32)
    with pytest.raises(KeyError, match="not supported"):
        block_type("IQ2_XXS")
