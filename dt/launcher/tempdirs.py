"""A launcher's temporary directories: named after their owner, removed by it, swept once it is dead.

A launcher keeps two directories in the temp directory while it runs: the
pool's rendezvous (its store file) and multiprocessing's own (the fork
server's socket, which multiprocessing would name pymp-...). Both go when
the launcher ends, normally or not, and the rendezvous also when its workers
see the launcher die, except when the whole job is SIGKILLed at once (a
scheduler's kill, an out-of-memory kill): nothing of it runs then. So each
is named dt-<kind>-<owner's pid>-..., and every start first removes those
whose owner is dead (`sweep`), as dt.transport.shm.segment does for
/dev/shm. A pid can be reused: such a directory waits for the next sweep
after that process ends; none is ever removed while its owner lives.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import re
import shutil
import tempfile

from dt.transport.shm.segment import alive

__all__ = ["KINDS", "make", "own_multiprocessing_dir", "sweep"]

KINDS = ("pool", "mp")  # the rendezvous; multiprocessing's (the fork server's socket)
_NAME = re.compile(rf"^dt-(?:{'|'.join(KINDS)})-(\d+)-[^-]+$")


def make(kind: str) -> str:
    """A new directory dt-<kind>-<this pid>-... in the temp directory, private to this user."""
    if kind not in KINDS:
        raise ValueError(f"no temporary directory kind {kind!r}: one of {', '.join(KINDS)}")
    return tempfile.mkdtemp(prefix=f"dt-{kind}-{os.getpid()}-")


def sweep() -> list[str]:
    """Remove the launcher directories whose owner is dead; return their names."""
    where = tempfile.gettempdir()
    try:
        names = os.listdir(where)
    except OSError:
        return []
    gone = []
    for name in names:
        m = _NAME.match(name)
        if m and int(m.group(1)) != os.getpid() and not alive(int(m.group(1))):
            shutil.rmtree(os.path.join(where, name), ignore_errors=True)
            gone.append(name)
    return gone


def own_multiprocessing_dir() -> None:
    """Give multiprocessing a directory named after this process (before it makes its own).

    multiprocessing makes its directory on first need (the fork server's socket) and
    removes it at exit (a finalizer of priority -100); this one is made and removed the
    same way, under a name `sweep` can tell is dead. A directory it already has is kept.
    """
    config = multiprocessing.process.current_process()._config  # noqa: SLF001 - where it keeps it
    if config.get("tempdir") is None:
        path = make("mp")
        multiprocessing.util.Finalize(None, shutil.rmtree, args=(path,), kwargs={"ignore_errors": True},
                                      exitpriority=-100)
        config["tempdir"] = path
