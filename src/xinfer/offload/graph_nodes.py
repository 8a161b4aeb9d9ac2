"""CUDA driver calls that torch does not expose, for work whose addresses the device decides
inside a CUDA graph: conditional nodes (WHILE, SWITCH) spliced into the graph a stream is
capturing, capture of further work into a node's body graphs, host→device copies issued on
the copy engine, and small CUDA C kernels compiled with NVRTC — among them the ones that set
a conditional node's value, which only device code can do (`cudaGraphSetConditional`).

ctypes over the driver (libcuda) and the NVRTC library torch already loads, so nothing is
added to the install. SWITCH nodes need a CUDA 12.8 driver; `unavailable_reason()` says why
this cannot run here (None: it can)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import site
from collections.abc import Iterator, Sequence

import torch

NODE_TYPE_CONDITIONAL = 13  # CU_GRAPH_NODE_TYPE_CONDITIONAL
COND_WHILE, COND_SWITCH = 1, 2  # CUgraphConditionalNodeType
SET_CAPTURE_DEPENDENCIES = 1  # CU_STREAM_SET_CAPTURE_DEPENDENCIES
CAPTURE_MODE_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED
CAPTURE_STATUS_ACTIVE = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE
MIN_DRIVER_VERSION = 12080  # SWITCH nodes

_c = ctypes
_voidp = _c.c_void_p


class _ConditionalParams(_c.Structure):  # CUDA_CONDITIONAL_NODE_PARAMS
    _fields_ = [
        ("handle", _c.c_uint64),
        ("type", _c.c_int),
        ("size", _c.c_uint),
        ("phGraph_out", _c.POINTER(_voidp)),  # written by the driver: the body graphs
        ("ctx", _voidp),
    ]


class _NodeUnion(_c.Union):
    _fields_ = [("reserved1", _c.c_longlong * 29), ("conditional", _ConditionalParams)]


class _NodeParams(_c.Structure):  # CUgraphNodeParams (256 bytes)
    _fields_ = [
        ("type", _c.c_int),
        ("reserved0", _c.c_int * 3),
        ("u", _NodeUnion),
        ("reserved2", _c.c_longlong),
    ]


assert _c.sizeof(_NodeParams) == 256


class DriverError(RuntimeError):
    pass


@functools.cache
def _libcuda() -> ctypes.CDLL:
    return _c.CDLL("libcuda.so.1")


def _function(*names: str):
    """The first of `names` the driver exports (versioned entry points differ by release)."""
    lib = _libcuda()
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = _c.c_int
            return fn, name
    raise DriverError(f"the CUDA driver has none of {', '.join(names)}")


def _check(result: int, what: str) -> None:
    if result != 0:
        text = _c.c_char_p()
        _libcuda().cuGetErrorName(result, _c.byref(text))
        name = text.value.decode() if text.value else f"error {result}"
        raise DriverError(f"{what} failed: {name}")


def driver_version() -> int:
    v = _c.c_int()
    _check(_libcuda().cuDriverGetVersion(_c.byref(v)), "cuDriverGetVersion")
    return v.value


@functools.cache
def unavailable_reason() -> str | None:
    """Why device-decided copies cannot run here, or None when they can."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return "it needs an NVIDIA GPU"
    try:
        version = driver_version()
        if version < MIN_DRIVER_VERSION:
            have = f"{version // 1000}.{version % 1000 // 10}"
            return f"it needs a CUDA 12.8 driver or newer (this one is {have})"
        _function("cuGraphConditionalHandleCreate")
        _function("cuStreamBeginCaptureToGraph")
        kernels()  # NVRTC present and able to build the setters
    except (OSError, DriverError, RuntimeError) as e:
        return str(e).splitlines()[0]
    return None


def _context() -> int:
    ctx = _voidp()
    _check(_libcuda().cuCtxGetCurrent(_c.byref(ctx)), "cuCtxGetCurrent")
    return ctx.value or 0


def _make_context_current() -> int:
    """The current device's primary context, made current on this thread. torch creates it
    lazily (first allocation or launch), so a driver call made before then — loading the
    setter kernels when the engine checks the fill, before any weight is read — finds none
    and fails with CUDA_ERROR_INVALID_CONTEXT."""
    ctx = _context()
    if ctx:
        return ctx
    torch.empty(1, device="cuda")  # the runtime creates the primary context, current here
    ctx = _context()
    if not ctx:
        raise DriverError("no CUDA context is current after torch's first allocation")
    return ctx


def capture_state(stream: int) -> tuple[int, list[int]]:
    """(graph being captured, its current dependency nodes) of a capturing stream."""
    status, cid, graph = _c.c_int(), _c.c_uint64(), _voidp()
    deps, n = _c.POINTER(_voidp)(), _c.c_size_t()
    fn, name = _function("cuStreamGetCaptureInfo_v3", "cuStreamGetCaptureInfo_v2")
    if name.endswith("_v3"):
        edges = _voidp()
        args = (_c.byref(deps), _c.byref(edges), _c.byref(n))
    else:
        args = (_c.byref(deps), _c.byref(n))
    res = fn(_voidp(stream), _c.byref(status), _c.byref(cid), _c.byref(graph), *args)
    _check(res, name)
    if status.value != CAPTURE_STATUS_ACTIVE:
        raise DriverError("the stream is not capturing a graph")
    return graph.value, [deps[i] for i in range(n.value)]


def set_capture_dependencies(stream: int, nodes: Sequence[int]) -> None:
    """What the next work captured on `stream` waits for."""
    arr = (_voidp * max(1, len(nodes)))(*nodes)
    fn, name = _function(
        "cuStreamUpdateCaptureDependencies_v2", "cuStreamUpdateCaptureDependencies"
    )
    if name.endswith("_v2"):
        res = fn(
            _voidp(stream), arr, None, _c.c_size_t(len(nodes)), _c.c_uint(SET_CAPTURE_DEPENDENCIES)
        )
    else:
        res = fn(_voidp(stream), arr, _c.c_size_t(len(nodes)), _c.c_uint(SET_CAPTURE_DEPENDENCIES))
    _check(res, name)


def new_handle(graph: int, default: int = 0) -> int:
    """A conditional handle of `graph`, reset to `default` at every launch of the graph."""
    h = _c.c_uint64()
    fn, name = _function("cuGraphConditionalHandleCreate")
    res = fn(_c.byref(h), _voidp(graph), _voidp(_context()), _c.c_uint(default), _c.c_uint(1))
    _check(res, name)
    return h.value


def add_conditional(
    graph: int, deps: Sequence[int], kind: int, handle: int, size: int
) -> tuple[int, list[int]]:
    """Add a WHILE (size 1) or SWITCH (size n) node after `deps`: (node, its body graphs)."""
    params = _NodeParams()
    params.type = NODE_TYPE_CONDITIONAL
    cond = params.u.conditional
    cond.handle, cond.type, cond.size, cond.ctx = handle, kind, size, _context()
    node = _voidp()
    arr = (_voidp * max(1, len(deps)))(*deps)
    fn, name = _function("cuGraphAddNode_v2", "cuGraphAddNode")
    if name.endswith("_v2"):
        res = fn(_c.byref(node), _voidp(graph), arr, None, _c.c_size_t(len(deps)), _c.byref(params))
    else:
        res = fn(_c.byref(node), _voidp(graph), arr, _c.c_size_t(len(deps)), _c.byref(params))
    _check(res, name)
    bodies = [params.u.conditional.phGraph_out[i] for i in range(size)]
    return node.value, bodies


def new_stream() -> int:
    """A CUDA stream of our own (non-blocking), for capturing node bodies. Not one of torch's
    `torch.cuda.Stream()`: those come round-robin from a pool of a few streams per device,
    so one can be the very stream that is capturing the decode graph or a prefetch (the
    driver then refuses a second capture on it: CUDA_ERROR_ILLEGAL_STATE)."""
    _make_context_current()
    stream = _voidp()
    _check(_libcuda().cuStreamCreate(_c.byref(stream), _c.c_uint(1)), "cuStreamCreate")
    return stream.value


def destroy_stream(stream: int) -> None:
    _libcuda().cuStreamDestroy_v2(_voidp(stream))


@contextlib.contextmanager
def capturing_into(graph: int, stream: int | torch.cuda.Stream) -> Iterator[int]:
    """Driver work issued on `stream` (a handle or a torch stream; yielded as its handle)
    lands in `graph`."""
    fn, name = _function("cuStreamBeginCaptureToGraph")
    s = stream if isinstance(stream, int) else stream.cuda_stream
    res = fn(_voidp(s), _voidp(graph), None, None, _c.c_size_t(0), _c.c_int(CAPTURE_MODE_RELAXED))
    _check(res, name)
    try:
        yield s
    finally:
        out = _voidp()
        _check(_libcuda().cuStreamEndCapture(_voidp(s), _c.byref(out)), "cuStreamEndCapture")


def copy_to_device(dst: int, src: int, nbytes: int, stream: int) -> None:
    """A host→device copy on the copy engine (a memcpy node when `stream` captures)."""
    fn, name = _function("cuMemcpyHtoDAsync_v2")
    _check(fn(_c.c_uint64(dst), _voidp(src), _c.c_size_t(nbytes), _voidp(stream)), name)


class Kernel:
    """A kernel of an NVRTC-built module, launched with explicitly typed arguments."""

    def __init__(self, func: int) -> None:
        self.func = func

    def launch(
        self,
        stream: int,
        grid: tuple[int, int],
        block: int,
        args: Sequence[ctypes._SimpleCData],
    ) -> None:
        ptrs = (_voidp * max(1, len(args)))(*[_c.cast(_c.byref(a), _voidp) for a in args])
        res = _libcuda().cuLaunchKernel(
            _voidp(self.func), grid[0], grid[1], 1, block, 1, 1, 0, _voidp(stream), ptrs, None
        )
        _check(res, "cuLaunchKernel")


@functools.cache
def _nvrtc() -> ctypes.CDLL:
    """NVRTC of the CUDA major version torch was built with: the library torch loaded (its
    `nvidia-cuda-nvrtc` package), else one on the loader's path."""
    major = (torch.version.cuda or "12").split(".")[0]
    candidates = [f"libnvrtc.so.{major}", "libnvrtc.so"]
    for root in site.getsitepackages() + [site.getusersitepackages()]:
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so.*")))
    for name in candidates:
        try:
            return _c.CDLL(name)
        except OSError:
            continue
    raise DriverError("NVRTC (libnvrtc, from the nvidia-cuda-nvrtc package) was not found")


def build_module(source: str, names: Sequence[str]) -> dict[str, Kernel]:
    """Compile CUDA C (extern "C" kernels) for this GPU with NVRTC and load it."""
    lib = _nvrtc()
    prog = _voidp()
    res = lib.nvrtcCreateProgram(_c.byref(prog), source.encode(), b"xinfer.cu", 0, None, None)
    if res != 0:
        raise DriverError(f"nvrtcCreateProgram failed ({res})")
    major, minor = torch.cuda.get_device_capability()
    opts = [f"--gpu-architecture=sm_{major}{minor}".encode(), b"-default-device", b"-std=c++17"]
    try:
        res = lib.nvrtcCompileProgram(prog, len(opts), (_c.c_char_p * len(opts))(*opts))
        if res != 0:
            size = _c.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, _c.byref(size))
            log = _c.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise DriverError(f"NVRTC could not build the kernels: {log.value.decode()[:400]}")
        size = _c.c_size_t()
        lib.nvrtcGetCUBINSize(prog, _c.byref(size))
        cubin = _c.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, cubin)
    finally:
        lib.nvrtcDestroyProgram(_c.byref(prog))
    module = _voidp()
    _make_context_current()
    _check(_libcuda().cuModuleLoadData(_c.byref(module), cubin), "cuModuleLoadData")
    out = {}
    for name in names:
        func = _voidp()
        _check(
            _libcuda().cuModuleGetFunction(_c.byref(func), module, name.encode()),
            f"cuModuleGetFunction({name})",
        )
        out[name] = Kernel(func.value)
    return out


# The device side of a copy loop (offload/copy_engine.py): a WHILE node over the miss list,
# each pass copying `ways` missed experts into bounce buffers through SWITCH nodes (one body
# per expert: fixed copy-engine copies) and placing them into their slot rows.
_SOURCE = r"""
extern "C" __device__ __cudart_builtin__ void CUDARTAPI cudaGraphSetConditional(
    cudaGraphConditionalHandle handle, unsigned int value);

// Before the loop: start at the first miss; loop only if there is one.
extern "C" __global__ void ce_begin(const int* count, int* cursor,
                                    cudaGraphConditionalHandle loop) {
  *cursor = 0;
  cudaGraphSetConditional(loop, *count > 0 ? 1u : 0u);
}

// First in each pass: which expert each bounce buffer receives (`none`: no body runs).
extern "C" __global__ void ce_select(const int* ids, const int* count, const int* cursor,
                                     int ways, unsigned int none,
                                     cudaGraphConditionalHandle h0,
                                     cudaGraphConditionalHandle h1,
                                     cudaGraphConditionalHandle h2,
                                     cudaGraphConditionalHandle h3) {
  int i = *cursor, n = *count;
  cudaGraphConditionalHandle h[4] = {h0, h1, h2, h3};
  for (int w = 0; w < ways; ++w)
    cudaGraphSetConditional(h[w], i + w < n ? (unsigned int)ids[i + w] : none);
}

// Copy bounce buffer `way` into the slot row of miss cursor + way, one tensor of the set per
// grid row (blockIdx.y). table: per tensor {destination base, row bytes, offset in the bounce
// buffer, word bytes}; every address and size is a multiple of the word.
extern "C" __global__ void ce_place(const long long* table, const char* bounce,
                                    const int* rows, const int* count, const int* cursor,
                                    int way) {
  int i = *cursor + way;
  if (i >= *count) return;
  const long long* t = table + 4 * blockIdx.y;
  char* dst = (char*)t[0] + (long long)rows[i] * t[1];
  const char* src = bounce + t[2];
  long long words = t[1] / t[3];
  long long step = (long long)gridDim.x * blockDim.x;
  long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t[3] == 16) {
    for (; k < words; k += step) ((int4*)dst)[k] = ((const int4*)src)[k];
  } else if (t[3] == 8) {
    for (; k < words; k += step) ((long long*)dst)[k] = ((const long long*)src)[k];
  } else if (t[3] == 4) {
    for (; k < words; k += step) ((int*)dst)[k] = ((const int*)src)[k];
  } else if (t[3] == 2) {
    for (; k < words; k += step) ((short*)dst)[k] = ((const short*)src)[k];
  } else {  // any other word: copy the row byte by byte
    for (; k < t[1]; k += step) dst[k] = src[k];
  }
}

// Last in each pass: move past this pass's misses; loop while some are left.
extern "C" __global__ void ce_next(const int* count, int* cursor, int ways,
                                   cudaGraphConditionalHandle loop) {
  int i = *cursor + ways;
  *cursor = i;
  cudaGraphSetConditional(loop, i < *count ? 1u : 0u);
}
"""
KERNEL_NAMES = ("ce_begin", "ce_select", "ce_place", "ce_next")


@functools.cache
def kernels() -> dict[str, Kernel]:
    return build_module(_SOURCE, KERNEL_NAMES)
