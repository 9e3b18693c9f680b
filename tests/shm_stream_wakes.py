"""Counts, not times: futex sleeps and how they ended while every rank streams big messages round
a ring (channels full often). A wake-up missed shows as a sleep that timed out, unrung, after which
the engine could move at once ("MISSED WAKE").

    python -m tests.shm_stream_wakes         # WORLD=2 REPS=40 BYTES=16 MiB
"""
from __future__ import annotations

import collections
import ctypes
import errno
import os

import torch
import torch.distributed as dist

from dt import transport
from dt.launcher import launch
from dt.transport.shm import sync as S


def job(reps: int, nbytes: int) -> dict:
    counts = collections.Counter()

    def fw(addr, expected, seconds):
        ts = S._Timespec(int(seconds), int((seconds % 1) * 1e9))
        ret = S._syscall(S._SYS_FUTEX, addr, S._FUTEX_WAIT, ctypes.c_int(expected), ctypes.byref(ts), None, 0)
        why = "woken" if ret == 0 else {errno.ETIMEDOUT: "timed out", errno.EAGAIN: "bell already rung"
                                        }.get(ctypes.get_errno(), "other")
        counts[why] += 1
        if why == "timed out":
            unrung = ctypes.c_int.from_address(addr.value).value == expected
            if unrung and engine[0] is not None and engine[0].progress():
                counts["MISSED WAKE (timed out, unrung, yet progress possible)"] += 1

    orig = S.futex_wait
    engine = [None]
    S.futex_wait = fw
    p, r = dist.get_world_size(), dist.get_rank()
    x = torch.full((nbytes // 4,), float(r))
    y = torch.empty_like(x)
    ok = True
    try:
        import dt
        dt.all_reduce(torch.ones(1))  # connects the group: shm wires from here on
        assert transport.resolve_group(None).links.wires is not None
        engine[0] = transport.resolve_group(None).links.host.engine
        with dt.traffic() as t:
            transport.send(x[:1], (r + 1) % p) if r % 2 == 0 else transport.recv(y[:1], (r - 1) % p)
        counts["wire " + ",".join(t.by_wire)] += 1
        dist.barrier()
        for _ in range(reps):  # a ring: everyone sends to the next and receives from the previous
            w = transport.isend(x, (r + 1) % p)
            transport.recv(y, (r - 1) % p)
            w.wait()
            ok &= bool(y[0].item() == (r - 1) % p and y[-1].item() == (r - 1) % p)
    finally:
        S.futex_wait = orig
    return {"counts": dict(counts), "ok": ok}


def main():
    w = int(os.environ.get("WORLD", "2"))
    print("loadavg before:", open("/proc/loadavg").read().strip())
    reps, nbytes = int(os.environ.get("REPS", "40")), int(os.environ.get("BYTES", str(16 << 20)))
    res = launch(job, w, reps, nbytes, timeout=600)
    print("loadavg after:", open("/proc/loadavg").read().strip())
    for r, got in enumerate(res):
        print(f"rank {r}: ok={got['ok']} sleeps: {got['counts']}")


if __name__ == "__main__":
    main()
