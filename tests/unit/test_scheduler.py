"""Scheduler under memory pressure: when KV blocks run out, requests are preempted and
recomputed, and every request still gets exactly what it gets alone (greedy)."""

from __future__ import annotations

import tiny_models as tm

from xinfer import LLM, SamplingParams
from xinfer.config import SchedulerConfig
from xinfer.engine.kv_cache import BlockAllocator
from xinfer.engine.request import Request
from xinfer.engine.scheduler import Scheduler


def test_preemption_keeps_outputs_exact(tmp_path):
    path = tm.write_checkpoint(tm.make_hf_model("qwen3_moe"), tmp_path / "m")
    prompts = tm.prompts(4, seed=9)
    params = SamplingParams(temperature=0, max_tokens=40)
    roomy = LLM(str(path), device="cpu", block_size=4)
    alone = [roomy.generate([p], params)[0].token_ids for p in prompts]
    # 24 blocks of 4 = 96 tokens: the four sequences need up to 5+17+9+30 + 4*40 = 221.
    tight = LLM(str(path), device="cpu", block_size=4, num_kv_blocks=24, max_model_len=96)
    sched = tight.engine.scheduler
    preempted = []
    schedule = sched.schedule

    def counting_schedule():
        out = schedule()
        preempted.append(out.num_preempted)
        return out

    sched.schedule = counting_schedule
    batched = [r.token_ids for r in tight.generate(prompts, params)]
    assert sum(preempted) > 0, "the test did not exercise preemption"
    assert batched == alone
    assert tight.engine.allocator.num_free == 24  # every block came back


def test_decodes_go_first_and_budget_holds():
    alloc = BlockAllocator(num_blocks=64, block_size=4)
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16)
    sched = Scheduler(config, alloc, layered_prompts=False)  # chunked long prompts
    long = Request("long", list(range(40)), SamplingParams())
    short = Request("short", [1, 2, 3], SamplingParams())
    sched.add(short)
    out = sched.schedule()  # short prefills
    short.num_computed_tokens += out.scheduled[0].num_new_tokens
    short.output_token_ids.append(7)
    sched.add(long)
    out = sched.schedule()
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [
        ("short", 1),  # the decode first
        ("long", 15),  # then a prompt chunk within the 16-token budget
    ]
    assert not out.scheduled[1].samples  # a partial prefill samples nothing
