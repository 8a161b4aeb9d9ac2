"""The start-up check of how fast the GPU reads the host store (offload/link_check.py): the
warning's rule on CPU; on a GPU, an offloading engine measures both rates and reports them
in its stats, and its output stays that of no offload."""

from __future__ import annotations

import pytest
import torch

from xinfer.offload.link_check import SLOW_SHARE, check_link, slow_host_warning


def test_a_slow_host_gets_one_warning_and_a_healthy_one_none():
    assert slow_host_warning(50.8, 55.5) is None  # a healthy H100 host
    assert slow_host_warning(SLOW_SHARE * 55.0, 55.0) is None  # the share itself: healthy
    text = slow_host_warning(31.8, 55.2)  # this session's slow host
    assert "31.8 GB/s, 0.58 of the 55.2 GB/s" in text and "XINFER_HOST_ALLOC=driver" in text
    assert slow_host_warning(10.0, 0.0) is None  # nothing measured: nothing said


def test_nothing_is_measured_off_cuda():
    assert check_link(object(), torch.device("cpu")) is None


@pytest.mark.gpu
def test_an_offloading_engine_reports_the_rates(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from tiny_models import make_hf_model, prompts, write_checkpoint

    from xinfer import LLM, SamplingParams

    path = write_checkpoint(make_hf_model("qwen3_moe"), tmp_path / "ckpt")
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    kw = dict(device="cuda:0", dtype="bfloat16", num_kv_blocks=64)
    want = [r.token_ids for r in LLM(str(path), **kw).generate(prompts(2), params)]
    llm = LLM(str(path), moe_offload=0.5, **kw)
    stats = llm.offload_stats()
    assert stats["host_read_gbps"] > 0 and stats["link_gbps"] > 0, stats
    assert [r.token_ids for r in llm.generate(prompts(2), params)] == want
