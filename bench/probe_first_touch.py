"""How fast does this host hand out fresh pages, and how should start-up fill host memory?

Both slow phases of an offloaded engine's start-up write fresh host pages: the dummy
experts (64.4 GB for the Qwen3.5-35B-A3B shape: 25.6 s on a healthy H100 host, 2026-12-06,
with the pages faulted in beforehand by `zero_` on torch's threads) and the packing's planes
(~0.27 s of `zero_` a layer for 1.2 GB, ~4.4 GB/s). On the CPU machine a first touch ran
0.4-4 GB/s and a rewrite 13-15 GB/s. This probe times, on mappings made by
`xinfer/host_memory.py` without its prefault (2 MiB-aligned, `MADV_HUGEPAGE` unless `4k`):

- the first touch by `zero_` on torch's intra-op threads (today's prefault);
- the first touch by `madvise(MADV_POPULATE_WRITE)` (Linux 5.14+) on 1..N Python threads
  (ctypes releases the GIL), which faults pages in without a trap per page;
- a rewrite of touched pages (the memory's write rate, for scale);
- `cudaHostRegister` of touched pages (the host store pins every expert tensor);
- GPU → host: an expert (6 MiB) at a time into pageable pages (the old dummy weights) against
  256 MiB chunks through a pinned buffer (weights/dummy.py since 2026-12-06).

Each row says whether the kernel gave huge pages (AnonHugePages grew).

    python3 bench/probe_first_touch.py --gb 4 --threads 1,4,8,16
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from xinfer import host_memory  # noqa: E402

HUGE_PAGE = host_memory.HUGE_PAGE
MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def anon_huge_kb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def fresh_mapping(nbytes: int, huge: bool) -> torch.Tensor:
    """An untouched mapping of `nbytes`, made as `host_empty` makes one (xinfer/host_memory.py)
    but without its prefault; `huge`: advised as huge pages or not. Freed when dropped."""
    return host_memory._mapped((nbytes,), torch.uint8, nbytes, prefault=False, advise_huge=huge)


def populate(t: torch.Tensor, threads: int) -> None:
    """Fault every page of `t` (a mapping's tensor) in with MADV_POPULATE_WRITE, split over
    `threads` threads."""
    libc, errors = _libc(), []
    nbytes, addr = t.numel() * t.element_size(), t.data_ptr()
    part = -(-nbytes // threads // mmap.PAGESIZE) * mmap.PAGESIZE

    def one(i: int) -> None:
        start = i * part
        size = min(part, nbytes - start)
        if size > 0 and libc.madvise(addr + start, size, MADV_POPULATE_WRITE) != 0:
            errors.append(ctypes.get_errno())

    pool = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise OSError(errors[0], "MADV_POPULATE_WRITE failed")


def timed_touch(nbytes: int, huge: bool, how, rows: list, name: str) -> None:
    t = fresh_mapping(nbytes, huge)
    before = anon_huge_kb()
    start = time.perf_counter()
    try:
        how(t)
    except OSError as e:
        rows.append({"what": name, "error": str(e)})
        return
    seconds = time.perf_counter() - start
    grew = anon_huge_kb() - before
    start = time.perf_counter()
    t.zero_()
    rewrite = time.perf_counter() - start
    rows.append({
        "what": name, "seconds": seconds, "gb_s": nbytes / seconds / 1e9,
        "rewrite_gb_s": nbytes / rewrite / 1e9, "huge_pages_gb": grew * 1024 / 1e9,
    })  # fmt: skip


def gpu_to_host(nbytes: int, device: torch.device, rows: list) -> None:
    """An expert at a time into pageable (prefaulted) pages, against chunks through pinned
    memory, from one GPU buffer of `nbytes`."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_(0, 0.02)
    expert = 6 << 20 >> 1  # elements of a 6 MiB expert
    host = fresh_mapping(nbytes, huge=True)
    host.zero_()
    dst = host.view(torch.bfloat16)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for i in range(0, dst.numel(), expert):
        dst[i : i + expert].copy_(src[i : i + expert])
    torch.cuda.synchronize(device)
    one = time.perf_counter() - start
    chunk = 256 << 20 >> 1
    pinned = torch.empty(chunk, dtype=torch.bfloat16, pin_memory=True)
    start = time.perf_counter()
    for i in range(0, dst.numel(), chunk):
        n = min(chunk, dst.numel() - i)
        pinned[:n].copy_(src[i : i + n], non_blocking=True)
        torch.cuda.current_stream(device).synchronize()
        dst[i : i + n].copy_(pinned[:n])
    chunked = time.perf_counter() - start
    rows.append({"what": "GPU -> host, an expert (6 MiB) at a time", "seconds": one,
                 "gb_s": nbytes / one / 1e9})  # fmt: skip
    rows.append({"what": "GPU -> host, 256 MiB chunks through pinned memory", "seconds": chunked,
                 "gb_s": nbytes / chunked / 1e9})  # fmt: skip
    start = time.perf_counter()
    torch.cuda.cudart().cudaHostRegister(host.data_ptr(), nbytes, 0)
    reg = time.perf_counter() - start
    torch.cuda.cudart().cudaHostUnregister(host.data_ptr())
    rows.append({"what": "cudaHostRegister of touched pages", "seconds": reg,
                 "gb_s": nbytes / reg / 1e9})  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=4.0, help="size of each mapping")
    ap.add_argument("--threads", default="1,4,8,16", help="MADV_POPULATE_WRITE thread counts")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    nbytes = int(args.gb * 1e9) // HUGE_PAGE * HUGE_PAGE
    rows: list[dict] = []
    for huge in (True, False):
        pages = "huge" if huge else "4k"
        name = f"zero_ on {torch.get_num_threads()} torch threads, {pages}"
        timed_touch(nbytes, huge, lambda t: t.zero_(), rows, name)
        for n in [int(x) for x in args.threads.split(",") if x]:
            timed_touch(nbytes, huge, lambda t, n=n: populate(t, n), rows,
                        f"MADV_POPULATE_WRITE x{n} threads, {pages}")  # fmt: skip
    if torch.cuda.is_available():
        gpu_to_host(nbytes, torch.device("cuda"), rows)
    print(f"# first touch of {nbytes / 1e9:.1f} GB mappings (AnonHugePages: {anon_huge_kb()} kB)")
    print("| what | s | GB/s | rewrite GB/s | huge pages GB |\n|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['what']} | {r['error']} | | | |")
            continue
        rw = f"{r['rewrite_gb_s']:.1f}" if "rewrite_gb_s" in r else ""
        hp = f"{r['huge_pages_gb']:.1f}" if "huge_pages_gb" in r else ""
        print(f"| {r['what']} | {r['seconds']:.3f} | {r['gb_s']:.1f} | {rw} | {hp} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
