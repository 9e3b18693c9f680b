"""fn(*args) on every rank of a fresh simulated cluster; each rank's result, as `dt.launcher.launch` gives.

    results = cluster_launch(fn, 2, 2, x, link_bits=1e9)   # fn(x) on 2 hosts x 2 ranks, in rank order

No second launcher: the hosts are run.py's (`dt cluster up`: namespaces,
capped links, a private /dev/shm each, torchrun on every host), and on each
rank the job runs through `dt.launcher.launch`, which under torchrun is the
launched world (every rank's result gathered, a failed rank named on all).
What this module adds is the way there and back: the job (fn by module and
name, as the pool's workers load it, and its arguments) is pickled into a
temporary directory of this call's own, every host runs
`python -m dt.launcher.cluster.launch DIR`, and each rank writes its own
result to DIR/rank<r>.pkl, which the caller reads back in rank order. A rank
with no file is an error carrying the hosts' last lines. The directory goes
on the way out, the namespaces and links with the cluster's `with`.
"""

from __future__ import annotations

import glob
import io
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from dt.launcher.cluster.run import cluster
from dt.launcher.pool import DEFAULT_TIMEOUT

__all__ = ["cluster_launch"]

JOB = "job.pkl"
STARTUP_S = 120.0  # torchrun's start and dt's import on every host, before the job's own timeout counts
TAIL = 30  # the hosts' last lines a failed run reports


def cluster_launch(fn: Callable[..., Any], hosts: int, per_host: int, *args: Any,
                   link_bits: float | None = None, timeout: float | None = None, backend: str = "gloo",
                   **kwargs: Any) -> list[Any]:
    """fn(*args, **kwargs) on each of hosts x per_host ranks of a fresh simulated cluster; every result."""
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    job_dir = tempfile.mkdtemp(prefix="dt-cluster-launch-")  # 0700: only this user reads the job
    try:
        with open(os.path.join(job_dir, JOB), "wb") as f:
            pickle.dump((fn, args, kwargs, timeout, backend), f)
        out = io.StringIO()  # the hosts' lines: shown only if the run fails
        with cluster(hosts, per_host, link_bits) as c:
            code = c.run([sys.executable, "-m", "dt.launcher.cluster.launch", job_dir], out=out,
                         timeout=timeout + STARTUP_S)
        return _results(job_dir, hosts * per_host, code, out.getvalue())
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)


def _results(job_dir: str, world: int, code: int, output: str) -> list[Any]:
    """Every rank's result from its file, in rank order; one rank missing fails the whole run,
    with the first rank's error as dt.launcher.launch told it (it names the rank that failed first),
    else the hosts' last lines (torchrun's own report of a rank that died without a word)."""
    missing = [r for r in range(world) if not os.path.exists(_path(job_dir, r))]
    if missing or code != 0:
        errors = sorted(glob.glob(os.path.join(job_dir, "error*.txt")))
        if errors:
            with open(errors[0]) as f:
                why = f.read()
        else:
            why = "the hosts' last lines:\n" + "\n".join(output.splitlines()[-TAIL:])
        raise RuntimeError(f"the simulated cluster's run ended with status {code}, no result from ranks "
                           f"{missing or 'none missing'}; {why}")
    results = []
    for r in range(world):
        with open(_path(job_dir, r), "rb") as f:
            results.append(pickle.load(f))
    return results


def _path(job_dir: str, rank: int) -> str:
    return os.path.join(job_dir, f"rank{rank}.pkl")


def main(job_dir: str) -> int:
    """One rank under torchrun: the job through dt.launcher.launch, this rank's result to its file."""
    import torch.distributed as dist

    from dt.launcher.world import launch

    with open(os.path.join(job_dir, JOB), "rb") as f:
        fn, args, kwargs, timeout, backend = pickle.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        results = launch(fn, world, *args, timeout=timeout, backend=backend, **kwargs)
    except BaseException as exc:  # told to the caller, whose output is not this process's
        with open(os.path.join(job_dir, f"error{rank}.txt"), "w") as f:
            f.write(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise
    tmp = _path(job_dir, rank) + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(results[rank], f)
    os.replace(tmp, _path(job_dir, rank))  # whole or absent: the caller never reads half a result
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
