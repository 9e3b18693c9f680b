"""One worker process of a local run: it dies with its launcher, joins the group, runs jobs.

The launcher (pool.py) starts `worker_main` in each process; the worker
serves one job after another from its pipe until told to stop.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from dt.launcher.group import init_process_group
from dt.transport import liveness, settings

__all__ = ["process_start", "threads_per_worker", "worker_main"]

WATCH_S = 0.5  # how often a worker checks that its launcher is alive


def threads_per_worker(world_size: int) -> int:
    return max(1, (os.cpu_count() or 1) // world_size)


def process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (to tell it from a later process with its pid); None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else fields[19]  # a zombie has died already


def _die_with_launcher(launcher: int, started: str | None) -> None:
    """Make this worker die with its launcher, however the launcher dies.

    1. A parent-death signal (Linux prctl(PR_SET_PDEATHSIG)): the kernel sends
       SIGKILL the moment our parent exits. Our parent is the fork server
       (forkserver start method), which exits as soon as the launcher does (its
       pipe from the launcher reads end-of-file), or the launcher itself (spawn).
    2. A watchdog thread that checks the launcher itself twice a second: it
       covers what the signal cannot (a parent gone before prctl ran, a fork
       server kept alive by another process).
    Ctrl-C reaches the whole terminal's process group: the launcher owns it,
    so workers ignore SIGINT and are stopped by their launcher, in order.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def alive() -> bool:
        if started is None:  # no /proc: ask the kernel whether the pid exists
            try:
                os.kill(launcher, 0)
                return True
            except ProcessLookupError:
                return False
        return process_start(launcher) == started

    def watch() -> None:
        while alive():
            time.sleep(WATCH_S)
        os.kill(os.getpid(), signal.SIGKILL)

    if not alive():
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, name="dt-launcher-watch", daemon=True).start()


def worker_main(rank: int, world_size: int, port: int, backend: str, conn: Any,
                 sys_path: list[str], threads: int, launcher: tuple[int, str | None]) -> None:
    _die_with_launcher(*launcher)
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    os.environ["DT_LAUNCHER_RANK"] = str(rank)
    torch.set_num_threads(threads)

    store = dist.TCPStore("127.0.0.1", port, None, False,
                          timeout=datetime.timedelta(seconds=60))
    os.environ["LOCAL_RANK"] = str(rank)  # every rank of a local run is on this host
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    # On NCCL dt's waits only order streams and NCCL's watchdog uses this timeout.
    init_process_group(backend, settings.get_timeout(), store=store, rank=rank,
                        world_size=world_size)
    liveness.attach(store)
    conn.send_bytes(pickle.dumps(("ready", None)))
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            break
        job = pickle.loads(msg)
        if job is None:
            break
        fn, args, kwargs, wait_timeout = job
        # Each run starts from the defaults (DT_TIMEOUT, DT_VALIDATE), whatever the last one set.
        settings.set_timeout(None)
        settings.set_validation(None)
        settings.set_launcher_timeout(wait_timeout)
        try:
            reply = pickle.dumps(("ok", fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            reply = pickle.dumps(("error", type(exc).__name__, str(exc), traceback.format_exc()))
        conn.send_bytes(reply)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
