"""One worker process of a local run: it dies with its launcher, joins the group, runs jobs.

The launcher (pool.py) starts `worker_main` in each process, with two pipes:
`conn` brings jobs and takes results back, `news` brings other ranks'
failures and takes this rank's (dt.transport.liveness) and, by closing,
says that the launcher is gone. The worker serves one job after another
until told to stop.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import pickle
import shutil
import signal
import sys
import traceback
from typing import Any

import torch
import torch.distributed as dist

from dt import transport
from dt.launcher.group import init_process_group, start_run
from dt.transport import liveness, settings

__all__ = ["threads_per_worker", "worker_main"]


def threads_per_worker(world_size: int) -> int:
    return max(1, (os.cpu_count() or 1) // world_size)


def _die_with_launcher(news: Any, store_path: str) -> None:
    """Make this worker die with its launcher, however the launcher dies, and hear of failed peers.

    Our parent is not the launcher: with the forkserver start method it is the
    fork server, and the fork server outlives the launcher for as long as any
    of its children lives (each child inherits the server's "alive" pipe), so
    a parent-death signal (prctl(PR_SET_PDEATHSIG)) alone would never fire.
    What does end with the launcher is the launcher's end of our `news` pipe:
    it is the only holder, so when the launcher dies, however it dies (SIGKILL
    included), our read sees end of file, at once. The liveness watchdog reads
    that pipe (failures of other ranks come down it, dt.transport.liveness)
    and kills this process on end of file (removing the store file first: the
    launcher cannot any longer). The parent-death signal stays for
    the spawn start method, where the parent is the launcher itself.

    Ctrl-C reaches the whole terminal's process group: the launcher owns it,
    so workers ignore SIGINT and are stopped by their launcher, in order.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def gone() -> None:  # a launcher that was SIGKILLed cannot remove the store's directory
        shutil.rmtree(os.path.dirname(store_path), ignore_errors=True)
        os.kill(os.getpid(), signal.SIGKILL)

    liveness.attach(liveness.PipeChannel(news), on_gone=gone)  # the store is a file: no port to keep


def _unloadable(exc: BaseException) -> str:
    """Why a job could not be unpickled here, in one line."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return (f"the job cannot be loaded in the worker ({first}): "
            "workers import the function by module and name, so define it in a module they can "
            "import (not in `python -c`, stdin or a notebook cell)")


def worker_main(rank: int, world_size: int, store_path: str, backend: str, conn: Any, news: Any,
                sys_path: list[str], threads: int) -> None:
    """One worker: joins the group on the launcher's store (a file), then runs each job sent down `conn`."""
    _die_with_launcher(news, store_path)
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    os.environ["DT_LAUNCHER_RANK"] = str(rank)
    torch.set_num_threads(threads)

    store = dist.FileStore(store_path, world_size)
    store.set_timeout(datetime.timedelta(seconds=60))
    os.environ["LOCAL_RANK"] = str(rank)  # every rank of a local run is on this host
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    # On NCCL dt's waits only order streams and NCCL's watchdog uses this timeout.
    init_process_group(backend, settings.timeout_for(None), store=store, rank=rank, world_size=world_size)
    conn.send_bytes(pickle.dumps(("ready", None)))
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            break
        try:
            job = pickle.loads(msg)
        except Exception as exc:  # noqa: BLE001 - the function's module or name is not found here
            conn.send_bytes(pickle.dumps(("error", type(exc).__name__, _unloadable(exc), "", False)))
            continue
        if job is None:
            break
        fn, args, kwargs, wait_timeout, env = job
        for name, value in env.items():  # the launcher's DT_TIMEOUT and DT_VALIDATE
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        start_run(wait_timeout)  # as a new process would (LaunchedWorld.run's too)
        try:
            reply = pickle.dumps(("ok", fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            reply = pickle.dumps(("error", type(exc).__name__, str(exc), traceback.format_exc(),
                                  transport.is_everywhere(exc)))
        conn.send_bytes(reply)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
