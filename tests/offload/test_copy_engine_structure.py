"""The copy-engine fill's graph, built on CPU against a recording stand-in for the driver
calls (offload/graph_nodes.py): which nodes `LayerCopies.fill` adds, in which order and on
what they wait, and every copy's addresses — the parts a GPU run would only show as wrong
bytes. (The GPU tests, tests/offload/test_copy_engine_gpu.py, run the real thing.)"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

from xinfer.offload import copy_engine
from xinfer.offload.slot_cache import SlotCache

MAIN = 1  # the stream torch captures the decode step on


class FakeDriver:
    """Graphs of nodes; a capturing stream appends to its graph after its dependencies."""

    def __init__(self) -> None:
        self.ids = itertools.count(100)
        self.nodes: dict[int, dict] = {}
        self.graph_of: dict[int, int] = {MAIN: 0}  # stream → graph it captures
        self.deps: dict[int, list[int]] = {MAIN: []}
        self.handles: dict[int, tuple[int, int]] = {}  # handle → (graph, default)
        self.kernels = {name: self._kernel(name) for name in copy_engine.gn.KERNEL_NAMES}

    def _add(self, graph: int, deps: list[int], **node) -> int:
        nid = next(self.ids)
        self.nodes[nid] = dict(graph=graph, deps=list(deps), **node)
        return nid

    def _append(self, stream: int, **node) -> int:
        nid = self._add(self.graph_of[stream], self.deps[stream], **node)
        self.deps[stream] = [nid]
        return nid

    def _kernel(self, name: str):
        driver = self

        class Kernel:
            def launch(self, stream, grid, block, args):
                values = [a.value for a in args]
                driver._append(stream, kind="kernel", name=name, grid=grid, args=values)

        return Kernel()

    # the graph_nodes functions copy_engine calls
    def capture_state(self, stream):
        return self.graph_of[stream], list(self.deps[stream])

    def new_handle(self, graph, default=0):
        h = next(self.ids)
        self.handles[h] = (graph, default)
        return h

    def add_conditional(self, graph, deps, kind, handle, size):
        bodies = [next(self.ids) for _ in range(size)]
        nid = self._add(graph, deps, kind="cond", cond=kind, handle=handle, bodies=bodies)
        return nid, bodies

    def set_capture_dependencies(self, stream, nodes):
        self.deps[stream] = list(nodes)

    @contextlib.contextmanager
    def capturing_into(self, graph, stream):
        assert stream not in self.graph_of, "a stream captures one graph at a time"
        self.graph_of[stream], self.deps[stream] = graph, []
        yield stream
        del self.graph_of[stream], self.deps[stream]

    def copy_to_device(self, dst, src, nbytes, stream):
        self._append(stream, kind="copy", dst=dst, src=src, nbytes=nbytes)

    def in_graph(self, graph, **match):
        return [
            (nid, n)
            for nid, n in self.nodes.items()
            if n["graph"] == graph and all(n.get(k) == v for k, v in match.items())
        ]


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver()
    for name in ("capture_state", "new_handle", "add_conditional", "set_capture_dependencies",
                 "capturing_into", "copy_to_device"):  # fmt: skip
        monkeypatch.setattr(copy_engine.gn, name, getattr(fake, name))
    monkeypatch.setattr(copy_engine.gn, "kernels", lambda: fake.kernels)
    return fake


@pytest.mark.parametrize("ways", [1, 2, 3])
def test_fill_builds_a_while_over_switches_with_one_copy_body_per_expert(driver, ways):
    num_experts, num_slots = 6, 3
    host = {  # three tensors of odd row sizes, so offsets and words differ
        "w13": torch.zeros(num_experts, 4, 8, dtype=torch.bfloat16),
        "scale": torch.zeros(num_experts, 3, dtype=torch.float32),
        "codes": torch.zeros(num_experts, 5, dtype=torch.uint8),
    }
    cache = SlotCache(host, num_slots, torch.device("cpu"))
    bounce = copy_engine.BounceBuffers(torch.device("cpu"), ways, streams=[2, 3])
    copies = copy_engine.LayerCopies(cache, host, bounce)
    rows = {"w13": 64, "scale": 12, "codes": 5}
    offsets = {"w13": 0, "scale": 64, "codes": 80}  # each 16-byte aligned in the buffer
    assert bounce.nbytes >= 85 and len(bounce.buffers) == ways
    table = copies.table.view(-1, 4).tolist()
    for (name, t), entry in zip(cache.slots.items(), table):
        word = {"w13": 16, "scale": 4, "codes": 1}[name]
        assert entry == [t.data_ptr(), rows[name], offsets[name], word], name

    copies.fill(stream=MAIN)
    count, cursor = cache.miss_count.data_ptr(), copies.cursor.data_ptr()
    # main graph: ce_begin → WHILE, and the next work waits for the WHILE
    (begin_id, begin), = driver.in_graph(0, name="ce_begin")  # fmt: skip
    (loop_id, loop), = driver.in_graph(0, kind="cond")  # fmt: skip
    assert begin["args"][:2] == [count, cursor] and begin["args"][2] == loop["handle"]
    assert loop["cond"] == copy_engine.gn.COND_WHILE and loop["deps"] == [begin_id]
    assert driver.handles[loop["handle"]] == (0, 0) and driver.deps[MAIN] == [loop_id]
    (body,) = loop["bodies"]
    # the body: select → SWITCH per way (each after the previous) → place per way → next
    (select_id, select), = driver.in_graph(body, name="ce_select")  # fmt: skip
    switches = driver.in_graph(body, kind="cond")
    places = driver.in_graph(body, name="ce_place")
    (next_id, nxt), = driver.in_graph(body, name="ce_next")  # fmt: skip
    assert len(switches) == len(places) == ways
    handles = [sw["handle"] for _, sw in switches]
    ids = cache.miss_ids.data_ptr()
    assert select["args"] == [ids, count, cursor, ways, num_experts] + handles + [0] * (4 - ways)
    assert all(driver.handles[h] == (body, num_experts) for h in handles)  # none by default
    for way, ((sw_id, sw), (_, pl)) in enumerate(zip(switches, places)):
        assert sw["cond"] == copy_engine.gn.COND_SWITCH and len(sw["bodies"]) == num_experts
        assert sw["deps"] == ([select_id] if way == 0 else [switches[way - 1][0]])
        assert pl["deps"] == [sw_id] and pl["grid"] == (copy_engine.PLACE_PROGRAMS, 3)
        buffer = bounce.buffers[way].data_ptr()
        assert pl["args"] == [
            copies.table.data_ptr(),
            buffer,
            cache.miss_slots.data_ptr(),
            count,
            cursor,
            way,
        ]
        for expert, branch in enumerate(sw["bodies"]):
            got = [(n["dst"], n["src"], n["nbytes"]) for _, n in driver.in_graph(branch)]
            assert got == [
                (buffer + offsets[name], t.data_ptr() + expert * rows[name], rows[name])
                for name, t in host.items()
            ], (way, expert)
    assert sorted(nxt["deps"]) == sorted(pid for pid, _ in places)
    assert nxt["args"] == [count, cursor, ways, loop["handle"]]
    assert not driver.in_graph(body, kind="copy")  # copies live in the SWITCH bodies only
