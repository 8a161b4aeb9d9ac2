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
    assert "31.8 GB/s, 0.58 of the 55.2 GB/s" in text and "slow hosts" in text
    assert slow_host_warning(10.0, 0.0) is None  # nothing measured: nothing said


def test_nothing_is_measured_off_cuda():
    assert check_link(object(), torch.device("cpu")) is None


@pytest.mark.gpu
def test_the_check_times_both_rates_and_leaves_the_tables_alone():
    """8 experts of 12 MiB (bf16 w13 and w2) in a pinned store: both rates measured (a few
    GB/s at least on any host), the slot tables still empty, no miss left for a lookup; a
    layer of tiny experts is not timed (its copy would time latency, not the link)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from xinfer.offload.executor import OffloadExecutor
    from xinfer.offload.host_store import HostExpertStore
    from xinfer.offload.slot_cache import SlotCache

    dev = torch.device("cuda", 0)
    store = HostExpertStore(dev)

    def executor(rows: int) -> OffloadExecutor:
        host = store.add_layer({"w13": torch.randn(8, 2, rows).to(torch.bfloat16),
                                "w2": torch.randn(8, rows).to(torch.bfloat16)})  # fmt: skip
        return OffloadExecutor(SlotCache(host, 6, dev), host, top_k=2, store=store)

    big = executor(2 << 20)  # 12 MiB an expert: 6 slots, 72 MiB timed
    rates = check_link(big, dev)
    assert rates["host_read_gbps"] > 1 and rates["link_gbps"] > 1, rates
    assert bool((big.cache.slot_of_expert == -1).all()) and int(big.cache.miss_count) == 0
    assert check_link(executor(1024), dev) is None  # 6 KiB experts
    store.close()
