"""bfloat16 on the CPU: runs, and its logits stay within bf16 rounding of float32 (HF on
the experts the bf16 run took; the CPU twin of the GPU parity check, bf16_parity.py)."""

from __future__ import annotations

import pytest
import tiny_models as tm
from bf16_parity import check_bf16_logits


@pytest.mark.parametrize("arch", list(tm.ARCHS))
def test_bfloat16_cpu_close_to_float32(arch, tmp_path):
    hf = tm.make_hf_model(arch)
    path = tm.write_checkpoint(hf, tmp_path / "m")
    check_bf16_logits(hf, path, "cpu", tm.prompts(3, seed=2), tmp_path / "routing.trace")
