"""Entry point of a follower rank started by rank 0 (`python -m xinfer.parallel.worker`):
reads its `WorkerArgs` from stdin, joins the group, builds its shard of the engine (the same
`Engine` constructor, which then follows rank 0's steps) and exits when told to stop."""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import signal
import struct
import sys
import threading
import time

import torch
import torch.distributed as dist

from xinfer.errors import UserError
from xinfer.parallel.group import init_group, set_current_group
from xinfer.parallel.launch import WorkerArgs, fail, watch_parent

_RENDEZVOUS_TIMEOUT = datetime.timedelta(seconds=120)


def _on_failure(message: str) -> None:
    """A collective failed: most likely rank 0 died, which the stdin watchdog reports
    in a moment with a plainer message; otherwise report this one."""
    time.sleep(0.5)
    fail(message)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle
    stdin = sys.stdin.buffer
    (size,) = struct.unpack("<Q", stdin.read(8))
    args: WorkerArgs = pickle.loads(stdin.read(size))
    config, par = args.config, args.config.parallel
    # Rank 0 reports for everyone; a follower speaks only about problems.
    level = max(logging.WARNING, logging.getLevelName(args.log_level))
    logging.basicConfig(level=level, format=f"%(levelname)s xinfer rank {par.rank}: %(message)s")
    threading.Thread(target=watch_parent, args=(stdin, par.rank), daemon=True).start()
    try:
        store = dist.TCPStore(
            "127.0.0.1", args.store_port, par.size, False, timeout=_RENDEZVOUS_TIMEOUT
        )
        device = torch.device(config.device)
        group = init_group(par.rank, par.size, device, "spawn", _on_failure, store=store)
        set_current_group(group)
        from xinfer.engine.engine import Engine

        Engine(config, show_progress=False)  # follows rank 0 until it says stop
    except UserError as e:
        fail(f"tensor-parallel rank {par.rank} ({config.device}): {e}", code=2)
    except SystemExit as e:  # the follower's normal end: skip the slow interpreter teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(e.code or 0)
    return 1  # the engine of a follower never returns


if __name__ == "__main__":
    sys.exit(main())
