"""offload/graph_nodes.py's ctypes glue on CPU, against a stand-in libcuda made of C-callable
callbacks (so ctypes marshals every argument as it would for the driver): the bytes of the
conditional node's parameters at the offsets CUDA 13's `cuda.h` gives them, the body graphs
read back from the array the driver hands out, capture info and dependency arrays, error
names, and the kernel parameter array of a launch."""

from __future__ import annotations

import ctypes as c

import pytest

from xinfer.offload import graph_nodes as gn

P = c.c_void_p
CB = c.CFUNCTYPE


def _read(ptr: int, ctype):
    return c.cast(ptr, c.POINTER(ctype))[0]


def _write(ptr: int, ctype, value) -> None:
    c.cast(ptr, c.POINTER(ctype))[0] = value


class FakeCuda:
    """The driver entry points graph_nodes calls; records what it was given."""

    CTX, GRAPH, STREAM = 0xC0, 0x6A, 0x51

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.keep: list = []  # arrays handed to the caller stay alive
        self.fail_with = 0
        self.capture_deps = (0x11, 0x12)
        self.num_params = 4  # kernel parameters a launch passes (read in the callback)

        def ok(name, *args):
            self.calls.append((name, *args))
            return self.fail_with

        @CB(c.c_int, c.c_int, P)
        def get_error_name(err, out):
            text = c.c_char_p(b"CUDA_ERROR_INVALID_VALUE")
            self.keep.append(text)
            _write(out, c.c_void_p, c.cast(text, c.c_void_p).value)
            return 0

        @CB(c.c_int, P)
        def ctx_get_current(out):
            _write(out, c.c_void_p, self.CTX)
            return 0

        @CB(c.c_int, P, P, P, P, P, P, P)
        def get_capture_info(stream, status, cid, graph, deps, edges, n):
            deps_arr = (c.c_void_p * 2)(*self.capture_deps)
            self.keep.append(deps_arr)
            _write(status, c.c_int, gn.CAPTURE_STATUS_ACTIVE)
            _write(graph, c.c_void_p, self.GRAPH)
            _write(deps, c.c_void_p, c.addressof(deps_arr))
            _write(n, c.c_size_t, 2)
            return ok("info", stream)

        @CB(c.c_int, P, P, P, c.c_size_t, c.c_uint)
        def update_deps(stream, deps, edges, n, flags):
            nodes = [_read(deps + 8 * i, c.c_void_p) for i in range(n)]
            return ok("update", stream, nodes, edges, flags)

        @CB(c.c_int, P, P, P, c.c_uint, c.c_uint)
        def handle_create(out, graph, ctx, default, flags):
            _write(out, c.c_uint64, 0xABCDEF0123)
            return ok("handle", graph, ctx, default, flags)

        @CB(c.c_int, P, P, P, P, c.c_size_t, P)
        def add_node(out, graph, deps, edges, n, params):
            raw = c.string_at(params, 256)
            nodes = [_read(deps + 8 * i, c.c_void_p) for i in range(n)]
            size = int.from_bytes(raw[28:32], "little")
            bodies = (c.c_void_p * size)(*[0x900 + i for i in range(size)])
            self.keep.append(bodies)
            _write(params + 32, c.c_void_p, c.addressof(bodies))  # phGraph_out, as CUDA does
            _write(out, c.c_void_p, 0x77)
            return ok("add", graph, nodes, edges, raw)

        @CB(c.c_int, P, P, P, P, c.c_size_t, c.c_int)
        def begin_to_graph(stream, graph, deps, edges, n, mode):
            return ok("begin", stream, graph, deps, edges, n, mode)

        @CB(c.c_int, P, P)
        def end_capture(stream, out):
            return ok("end", stream)

        @CB(c.c_int, c.c_uint64, P, c.c_size_t, P)
        def memcpy(dst, src, nbytes, stream):
            return ok("copy", dst, src, nbytes, stream)

        @CB(c.c_int, P, c.c_uint, c.c_uint, c.c_uint, c.c_uint, c.c_uint, c.c_uint, c.c_uint,
            P, P, P)  # fmt: skip
        def launch(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            # the array lives only during the call: keep where its first entries point
            slots = [_read(params + 8 * i, c.c_void_p) for i in range(self.num_params)]
            return ok("launch", func, (gx, gy, gz), (bx, by, bz), shared, stream, slots, extra)

        @CB(c.c_int, P, c.c_uint)
        def stream_create(out, flags):
            _write(out, c.c_void_p, 0x5E)
            return ok("stream", flags)

        @CB(c.c_int, P)
        def stream_destroy(stream):
            return ok("destroy", stream)

        self.cuStreamCreate = stream_create
        self.cuStreamDestroy_v2 = stream_destroy
        self.cuGetErrorName = get_error_name
        self.cuCtxGetCurrent = ctx_get_current
        self.cuStreamGetCaptureInfo_v3 = get_capture_info
        self.cuStreamUpdateCaptureDependencies_v2 = update_deps
        self.cuGraphConditionalHandleCreate = handle_create
        self.cuGraphAddNode_v2 = add_node
        self.cuStreamBeginCaptureToGraph = begin_to_graph
        self.cuStreamEndCapture = end_capture
        self.cuMemcpyHtoDAsync_v2 = memcpy
        self.cuLaunchKernel = launch


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(gn, "_libcuda", lambda: fake)
    return fake


def test_conditional_node_parameters_have_cuda_h_layout(cuda):
    node, bodies = gn.add_conditional(0x6A, [0x11, 0x12], gn.COND_SWITCH, 0xABCDEF0123, 5)
    name, graph, deps, edges, raw = cuda.calls[-1]
    assert (name, graph, deps, edges) == ("add", 0x6A, [0x11, 0x12], None)
    le = lambda lo, hi: int.from_bytes(raw[lo:hi], "little")  # noqa: E731
    assert le(0, 4) == 13 and raw[4:16] == bytes(12)  # CU_GRAPH_NODE_TYPE_CONDITIONAL
    assert le(16, 24) == 0xABCDEF0123  # handle
    assert le(24, 28) == 2 and le(28, 32) == 5  # CU_GRAPH_COND_TYPE_SWITCH, size
    assert le(40, 48) == FakeCuda.CTX  # ctx
    assert raw[48:] == bytes(256 - 48)  # the rest of the union and reserved2 stay zero
    assert node == 0x77 and bodies == [0x900 + i for i in range(5)]


def test_capture_state_handles_and_dependencies(cuda):
    assert gn.capture_state(FakeCuda.STREAM) == (FakeCuda.GRAPH, [0x11, 0x12])
    assert gn.new_handle(0x6A, default=7) == 0xABCDEF0123
    assert cuda.calls[-1] == ("handle", 0x6A, FakeCuda.CTX, 7, 1)  # reset at every launch
    gn.set_capture_dependencies(FakeCuda.STREAM, [0x31, 0x32, 0x33])
    assert cuda.calls[-1] == ("update", FakeCuda.STREAM, [0x31, 0x32, 0x33], None, 1)


def test_capture_into_a_body_and_copy(cuda):
    class Stream:
        cuda_stream = 0x52

    with gn.capturing_into(0x901, Stream()) as s:
        assert s == 0x52 and cuda.calls[-1] == ("begin", 0x52, 0x901, None, None, 0, 2)
        gn.copy_to_device(0x7000_0000, 0x5000_0000, 4096, s)
    assert cuda.calls[-2] == ("copy", 0x7000_0000, 0x5000_0000, 4096, 0x52)
    assert cuda.calls[-1] == ("end", 0x52)


def test_kernel_parameters_point_at_typed_values(cuda):
    kernel = gn.Kernel(0xF00)
    args = [c.c_void_p(0x1234), c.c_int(-3), c.c_uint(9), c.c_uint64(0xABCDEF0123)]
    kernel.launch(FakeCuda.STREAM, (132, 3), 256, args)
    name, func, grid, block, shared, stream, slots, extra = cuda.calls[-1]
    assert (func, grid, block, shared, stream, extra) == (
        0xF00, (132, 3, 1), (256, 1, 1), 0, FakeCuda.STREAM, None
    )  # fmt: skip
    assert _read(slots[0], c.c_void_p) == 0x1234 and _read(slots[1], c.c_int) == -3
    assert _read(slots[2], c.c_uint) == 9 and _read(slots[3], c.c_uint64) == 0xABCDEF0123


def test_driver_errors_name_the_call(cuda):
    cuda.fail_with = 1
    with pytest.raises(gn.DriverError, match="cuGraphConditionalHandleCreate failed: "
                                             "CUDA_ERROR_INVALID_VALUE"):  # fmt: skip
        gn.new_handle(0x6A)


def test_body_streams_are_our_own_non_blocking_streams(cuda):
    """Bodies capture on driver-made streams (torch's pooled streams can be the capturing
    one), and `capturing_into` takes such a handle as it is."""
    s = gn.new_stream()
    assert s == 0x5E and cuda.calls[-1] == ("stream", 1)  # CU_STREAM_NON_BLOCKING
    with gn.capturing_into(0x901, s) as got:
        assert got == 0x5E and cuda.calls[-1] == ("begin", 0x5E, 0x901, None, None, 0, 2)
    gn.destroy_stream(s)
    assert cuda.calls[-1] == ("destroy", 0x5E)
