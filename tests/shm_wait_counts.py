"""Counts, not times: how a small all_reduce's shm waits end, back to back and between barriers.

    python -m tests.shm_wait_counts          # N=2000 BYTES=4096 WORLD=2; FORCE_SPARE=1 spins always

A diagnostic for issue 21 (not a test): the shared-memory sync's functions are wrapped in each
worker (restored after) to count syncs, peers not yet there on arrival, spins skipped for want of
a spare core, futex sleeps by how they ended, and bells rung; per op, which rank slept.
"""
from __future__ import annotations

import collections
import os
import threading

import torch
import torch.distributed as dist

import dt
from dt.bench.harness import barrier
from dt.launcher import launch
from dt.transport import set_validation
from dt.transport.shm import sync as S

N = int(os.environ.get("N", "2000"))


def job(n: int, nbytes: int) -> dict:
    counts: dict = collections.defaultdict(collections.Counter)
    where = {"ctx": "warm"}
    local = threading.local()
    orig_sync, orig_wait, orig_spare = S.Sync.sync, S.Sync.wait, S._spare_core
    orig_fk, orig_ring = S.futex_wake, S.Sync.ring

    per_call: dict = collections.defaultdict(list)  # ctx -> sleeps in each op, in order
    def c(key):  # main thread only; other threads counted apart
        ctx = where["ctx"] if threading.current_thread() is threading.main_thread() else "other-thread"
        counts[ctx][key] += 1
        if key.startswith("futex_wait") and ctx in per_call:
            per_call[ctx][-1] += 1

    def begin(ctx):
        where["ctx"] = ctx
        per_call[ctx].append(0)

    def sync(self, what, timeout):
        c("sync")
        local.in_sync = True
        try:
            return orig_sync(self, what, timeout)
        finally:
            local.in_sync = False

    def wait(self, *a, **k):
        c("wait from sync (spin ended or skipped)" if getattr(local, "in_sync", False) else "wait (p2p)")
        return orig_wait(self, *a, **k)

    def spare(now):
        got = True if os.environ.get("FORCE_SPARE") else orig_spare(now)
        if getattr(local, "in_sync", False):
            c("sync: peer not yet there on arrival")
        c("spare core" if got else "NO spare core: spin skipped")
        return got

    import ctypes
    import errno

    def fw(addr, expected, seconds):
        ts = S._Timespec(int(seconds), int((seconds % 1) * 1e9))
        ret = S._syscall(S._SYS_FUTEX, addr, S._FUTEX_WAIT, ctypes.c_int(expected), ctypes.byref(ts), None, 0)
        why = "woken" if ret == 0 else {errno.ETIMEDOUT: "timed out", errno.EAGAIN: "bell already rung",
                                       errno.EINTR: "signal"}.get(ctypes.get_errno(), "other")
        c(f"futex_wait: {why}")

    def ring(self, rank):
        if self.words[rank * S.WORDS + S.SLEEPING]:
            c("ring by Sync.ring (p2p: data or slot taken)")
        return orig_ring(self, rank)

    def fk(*a):
        c("futex_wake (ring)")
        return orig_fk(*a)

    patched = [(S.Sync, "sync", sync), (S.Sync, "wait", wait), (S, "_spare_core", spare),
               (S, "futex_wait", fw), (S, "futex_wake", fk), (S.Sync, "ring", ring)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    for owner, name, new in patched:
        setattr(owner, name, new)
    set_validation(False)
    x = torch.ones(nbytes // 4)
    try:
        for _ in range(50):
            dt.all_reduce(x)
            barrier()
        dist.barrier()
        for _ in range(4):  # interleaved blocks: drifting load hits both modes alike
            for _ in range(n // 4):
                begin("b2b call")
                dt.all_reduce(x)
            dist.barrier()
            for _ in range(n // 4):
                begin("barrier")
                barrier()
                begin("call after barrier")
                dt.all_reduce(x)
            where["ctx"] = "warm"
            dist.barrier()
    finally:
        for owner, name, old in saved:
            setattr(owner, name, old)
        set_validation(None)
    from dt.transport import resolve_group
    b = resolve_group(None).links.board
    return {"spin_s": b.sync.spin_s if b else None, "counts": {k: dict(v) for k, v in counts.items()},
            "per_call": dict(per_call)}


def main():
    print("loadavg before:", open("/proc/loadavg").read().strip())
    res = launch(job, int(os.environ.get("WORLD", "2")), N, int(os.environ.get("BYTES", "4096")), timeout=600)
    print("loadavg after:", open("/proc/loadavg").read().strip())
    for r, got in enumerate(res):
        print(f"rank {r}: spin_s={got['spin_s']}")
        for ctx, cs in got["counts"].items():
            print(f"  {ctx}: " + ", ".join(f"{k}={v}" for k, v in sorted(cs.items())))

    summarize(res)


def summarize(res):
    r0, r1 = res[0]["per_call"], res[1]["per_call"]
    for ctx in ("b2b call", "call after barrier", "barrier"):
        a, b = r0[ctx], r1[ctx]
        n = len(a)
        slept0 = sum(x > 0 for x in a) / n
        slept1 = sum(x > 0 for x in b) / n
        either = sum((x > 0) or (y > 0) for x, y in zip(a, b)) / n
        both = sum((x > 0) and (y > 0) for x, y in zip(a, b)) / n
        more = sum(x > 1 for x in a + b) / n
        print(f"{ctx}: {n} ops; rank 0 slept in {slept0:.0%}, rank 1 in {slept1:.0%}, either {either:.0%}, "
              f"both {both:.0%}; ops where a rank slept twice or more {more:.0%}")
        if ctx == "b2b call":
            same = sum((a[i] > 0) == (a[i + 1] > 0) for i in range(n - 1)) / (n - 1)
            print(f"  rank 0 slept (or not) as in its previous call: {same:.0%} (0% = strict alternation)")
    a_bar, b_bar = r0["barrier"], r1["barrier"]
    a_call, b_call = r0["call after barrier"], r1["call after barrier"]
    chain = sum(((x > 0) and (w > 0) and not (y > 0)) or ((y > 0) and (z > 0) and not (x > 0))
                for x, y, w, z in zip(a_bar, b_bar, b_call, a_call)) / len(a_bar)
    print(f"cycles where the rank that slept in the barrier was the one NOT sleeping in the call "
          f"(the other slept waiting for it): {chain:.0%}")


if __name__ == "__main__":
    main()
