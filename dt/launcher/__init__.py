"""Start N processes on this machine, run a function on each, never hang.

    results = run_workers(fn, 4, x, timeout=60)   # fn(x) on ranks 0..3

- The parent owns the rendezvous: a store file in a directory of its own
  (c10d's FileStore), so two runs at once never share it, no port is raced
  for, and no start waits on a DNS lookup (a TCPStore on localhost names each
  peer by a reverse lookup: a dropped DNS query stalled a start 5 s).
- Results travel back pickled by plain `pickle` over a pipe, never through a
  multiprocessing queue, whose tensor pickler passes a shared-memory handle
  that blocks the parent forever once the worker that made it has exited.
- The first worker exception comes back to the caller with its rank and
  traceback, together with what every other rank raised; workers still
  running after a short grace are killed. A run that outlives `timeout` is
  killed, and the transport's own timeout (a fraction of it) has by then made
  each stuck rank say in which collective, at which step, waiting on whom.
- `WorkerPool` keeps the processes and their process group alive between
  runs (the test suite pays the start-up once per world size); a pool whose
  run failed is restarted before its next run.
- Nothing is orphaned: every worker dies with its launcher, however the
  launcher dies (SIGKILL included): each worker reads a pipe whose other end
  only the launcher holds, and ends itself at its end of file (worker.py).
  SIGTERM, SIGHUP and Ctrl-C stop the launcher, which stops its workers
  before it exits (exit status 128 + the signal). A job SIGKILLed whole
  leaves its temporary directories; the next start removes them (tempdirs.py).
- Nothing waits on the dead: the launcher announces each worker that dies or
  raises, and relays what the workers announce (dt.transport.liveness), so the
  survivors' pending waits end within a second and name that rank; the
  headline names the first rank that died or raised, and how, never a
  survivor that only lost its peer. When a run outlives its timeout the
  launcher announces that too, and the stuck ranks say where they are.
- A rank that never arrives (it hangs in its own compute; the others time out
  on it) is the one named, from whom the timed-out ranks waited on.
- What would kill the workers before the function runs (a bad DT_TIMEOUT, a
  script with no `__main__` guard, a nested function) is refused in one line
  before any worker starts (preflight.py).
- Under torchrun (RANK, WORLD_SIZE and MASTER_ADDR in the environment) the
  tools run on the launched ranks instead (`open_world`, `launch`): the same
  worker code runs single-node or multi-node, unchanged, and every rank's
  result is gathered, as from a local pool. Once a rank has failed, the others
  end the run after the same short grace (torchrun then stops the rest), and
  each rank dies with its torchrun agent, SIGKILL included.

Files: pool.py (WorkerPool, run_workers: starting, collecting, blaming),
preflight.py (what is checked before a worker starts), worker.py (one
worker: dies with its launcher, serves jobs), tempdirs.py (the launcher's
temporary directories, swept once their owner is dead), group.py (the process group
and its backend), torchrun.py (joining torchrun's group),
world.py (the launched world or a local pool: what every tool runs on),
command.py (how a `dt` command ends when a run fails or is stopped),
cluster/ (a simulated cluster: hosts as network namespaces, `dt cluster`).
"""

from dt.launcher.command import run_command
from dt.launcher.pool import DEFAULT_TIMEOUT, RemoteError, Terminated, WorkerError, WorkerPool, run_workers
from dt.launcher.torchrun import init, under_torchrun
from dt.launcher.world import (
    LaunchedWorld,
    WorldConflict,
    launch,
    launched_rank,
    launched_size,
    open_world,
    rank_zero_output,
    resolve_world,
)

__all__ = ["DEFAULT_TIMEOUT", "LaunchedWorld", "RemoteError", "Terminated", "WorkerError", "WorkerPool",
           "WorldConflict", "init", "launch", "launched_rank", "launched_size", "open_world",
           "rank_zero_output", "resolve_world", "run_command", "run_workers", "under_torchrun"]
