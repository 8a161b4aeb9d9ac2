"""Fill on the copy engine: inside a captured decode graph, a layer's missed experts move
host→device as copy-engine copies, spending no SM on them. Opt-in
(`--moe-offload-fill copy-engine`): measured on the H200 (2026-12-04, docs/benchmarks.md) it
moves 43 GB/s a miss in the graph (the fill kernel 49) and its conditional nodes cost ~23 µs
a layer even without a miss, so serial decode is slower with it (20%, batch 1: 46.9 tok/s
against 52.8); its use is a fill that overlaps compute (prefetch), not yet shown to pay.

A CUDA graph's copies have fixed addresses, and which expert misses is known only on the
device. So each layer's fill is a WHILE node over the lookup's miss list; a pass takes
`ways` misses, and for each a SWITCH node with one body per expert — body e copies expert e
of the host store into a bounce buffer — then a small kernel places the bounce buffer into
the miss's slot row (device to device, at HBM speed) while the copy engine already moves the
next miss. Kernels that set the nodes' values: offload/graph_nodes.py.

Only graph capture uses it (`LayerCopies.fill` requires a capturing stream); eager calls keep
the fill kernel, which writes the same bytes to the same rows. The result is the twin's
(`lookup.fill_reference`) either way: GPU tests compare them."""

from __future__ import annotations

import ctypes
import weakref

import torch

from xinfer.offload import graph_nodes as gn
from xinfer.offload.slot_cache import SlotCache

WAYS = 2  # misses a pass moves (bounce buffers); the kernels take up to 4
PLACE_BLOCK = 256
PLACE_PROGRAMS = 132  # per tensor of the set: one wave of the H200's SMs


def _destroy_streams(streams: list[int]) -> None:
    for stream in streams:
        gn.destroy_stream(stream)


def _word(*values: int) -> int:
    for w in (16, 8, 4, 2, 1):
        if all(v % w == 0 for v in values):
            return w
    return 1


class BounceBuffers:
    """What every layer's copy-engine fill on a device shares: the `ways` bounce buffers
    (layers fill one after the other on the decode stream), sized before capture to the
    largest expert, and the side streams that capture the node bodies."""

    def __init__(self, device: torch.device, ways: int = WAYS, streams: list | None = None) -> None:
        if not 1 <= ways <= 4:
            raise ValueError(f"ways must be 1 to 4, got {ways}")
        self.device, self.ways = device, ways
        self.buffers: list[torch.Tensor] = []
        self.nbytes = 0
        # Depth 0 captures a WHILE body, depth 1 a SWITCH body (made now: not during capture;
        # our own streams, never one of torch's pooled ones: see `graph_nodes.new_stream`).
        if streams is None:
            streams = [gn.new_stream() for _ in range(2)]
            weakref.finalize(self, _destroy_streams, list(streams))
        self.streams = streams

    def reserve(self, expert_bytes: int) -> None:
        if expert_bytes <= self.nbytes:
            return
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("bounce buffers must be reserved before graph capture")
        size = -(-expert_bytes // 256) * 256
        self.buffers = [
            torch.empty(size, dtype=torch.uint8, device=self.device) for _ in range(self.ways)
        ]
        self.nbytes = size


class LayerCopies:
    """One offloaded layer's copy-engine fill: its host rows, slot view and place table."""

    def __init__(
        self, cache: SlotCache, host_tensors: dict[str, torch.Tensor], bounce: BounceBuffers
    ) -> None:
        self.cache, self.bounce = cache, bounce
        gn.kernels()  # built and loaded now: a module load is refused during graph capture
        self.host = []  # (host base address, row bytes, offset in the bounce buffer)
        table, offset = [], 0
        for name, host in host_tensors.items():
            if not isinstance(host, torch.Tensor):  # a packing: OffloadConfig refuses this
                raise ValueError(f"the copy-engine fill copies tensors; {name!r} is packed")
            row = host[0].numel() * host.element_size()
            dst = cache.slots[name]
            offset = -(-offset // 16) * 16
            self.host.append((host.data_ptr(), row, offset))
            table += [dst.data_ptr(), row, offset, _word(dst.data_ptr(), row, offset)]
            offset += row
        bounce.reserve(offset)
        self.table = torch.tensor(table, dtype=torch.int64, device=cache.device)
        self.cursor = torch.zeros(1, dtype=torch.int32, device=cache.device)

    def fill(self, stream: int | None = None) -> None:
        """Capture this layer's fill (after its lookup) into the graph that `stream` (default:
        torch's current stream) is capturing."""
        k, cache, ways = gn.kernels(), self.cache, self.bounce.ways
        c = ctypes
        s = torch.cuda.current_stream(cache.device).cuda_stream if stream is None else stream
        graph, _ = gn.capture_state(s)
        loop = gn.new_handle(graph)
        count, cursor = c.c_void_p(cache.miss_count.data_ptr()), c.c_void_p(self.cursor.data_ptr())
        k["ce_begin"].launch(s, (1, 1), 1, [count, cursor, c.c_uint64(loop)])
        graph, deps = gn.capture_state(s)
        node, (body,) = gn.add_conditional(graph, deps, gn.COND_WHILE, loop, 1)
        gn.set_capture_dependencies(s, [node])
        with gn.capturing_into(body, self.bounce.streams[0]) as b:
            self._capture_pass(b, body, ways, count, cursor, loop)

    def _capture_pass(self, b: int, body: int, ways: int, count, cursor, loop: int) -> None:
        k, cache, c = gn.kernels(), self.cache, ctypes
        experts = cache.num_experts
        handles = [gn.new_handle(body, experts) for _ in range(ways)]
        ids = c.c_void_p(cache.miss_ids.data_ptr())
        padded = handles + [0] * (4 - ways)
        args = [ids, count, cursor, c.c_int(ways), c.c_uint(experts)]
        k["ce_select"].launch(b, (1, 1), 1, args + [c.c_uint64(h) for h in padded])
        _, deps = gn.capture_state(b)
        places, previous = [], None
        for way, handle in enumerate(handles):
            # The copy engine takes the misses one after another; each placement waits only
            # for its own copy, so it overlaps the next way's copy.
            after = deps if previous is None else [previous]
            switch, branches = gn.add_conditional(body, after, gn.COND_SWITCH, handle, experts)
            buffer = self.bounce.buffers[way].data_ptr()
            for expert, branch in enumerate(branches):
                with gn.capturing_into(branch, self.bounce.streams[1]) as cs:
                    for base, row, offset in self.host:
                        gn.copy_to_device(buffer + offset, base + expert * row, row, cs)
            gn.set_capture_dependencies(b, [switch])
            rows = c.c_void_p(cache.miss_slots.data_ptr())
            table = c.c_void_p(self.table.data_ptr())
            k["ce_place"].launch(
                b,
                (PLACE_PROGRAMS, len(self.host)),
                PLACE_BLOCK,
                [table, c.c_void_p(buffer), rows, count, cursor, c.c_int(way)],
            )
            _, placed = gn.capture_state(b)
            places += placed
            previous = switch
        gn.set_capture_dependencies(b, places)
        k["ce_next"].launch(b, (1, 1), 1, [count, cursor, c.c_int(ways), c.c_uint64(loop)])
