"""Named shared-memory segments in /dev/shm that never outlive their processes.

A segment is a file in /dev/shm (a tmpfs: memory, not disk) that the ranks
of one host map into their address spaces. Its life:

1. the host's leader (its lowest group rank) `create`s it: O_EXCL, sized
   with ftruncate (pages are allocated on first touch, not here), mapped;
2. every other rank of the host `attach`es: opens it by name and maps it;
3. once every rank has mapped it, the leader unlinks the name at once.

The mapping outlives the name, so from step 3 on nothing can leak: the
memory goes back to the kernel when the last process unmaps it or dies,
however it dies. Only the short window between 1 and 3 can leave a name
behind, and three things close it: the leader unlinks on an exception and
at exit (atexit), and every process that creates a segment first `sweep`s
names whose creator is dead (a crash in that window, by anyone's run).

Names: dt-<creator pid>-<token>-<what>, the token being group rank 0's
random number for this group, so two jobs (or two groups) never collide,
and the pid tells a sweep whether the creator still lives.
"""

from __future__ import annotations

import atexit
import mmap
import os
import re
import threading
from dataclasses import dataclass, field

import torch

__all__ = ["DIR", "NAMES", "Names", "Segment", "alive", "segment_name", "sweep"]

DIR = "/dev/shm"
_NAME = re.compile(r"^dt-(\d+)-[0-9a-f]+-[A-Za-z0-9_.-]+$")

@dataclass(eq=False)
class Names:
    """The segment names this process created and has not unlinked yet (unlinked at exit).

    `reset()` (dt.transport.reset) unlinks them now: a name outlives a run only when
    a run failed mid-setup. `swept`: whether this process has swept dead creators' names.
    """

    pending: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    swept: bool = False

    def reset(self) -> None:
        for name in list(self.pending):
            Segment.unlink_name(name)


NAMES = Names()


def segment_name(pid: int, token: str, what: str) -> str:
    """dt-<pid>-<token>-<what>, `what` made safe for a file name."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", what)
    return f"dt-{pid}-{token}-{safe}"


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (a dead rank its parent has not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


def sweep() -> list[str]:
    """Unlink dt segments whose creator is dead (left by a crash mid-setup); return their names."""
    gone = []
    try:
        names = os.listdir(DIR)
    except OSError:
        return gone
    for name in names:
        m = _NAME.match(name)
        if m and not alive(int(m.group(1))):
            try:
                os.unlink(os.path.join(DIR, name))
                gone.append(name)
            except OSError:
                pass
    return gone


class Segment:
    """One mapped segment: `tensor` is its bytes as a uint8 tensor, `mm` the mapping."""

    def __init__(self, name: str, size: int, mm: mmap.mmap):
        self.name, self.size, self.mm = name, size, mm
        self.tensor = torch.frombuffer(mm, dtype=torch.uint8)  # host: the mapping

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        if not NAMES.swept:
            NAMES.swept = True
            sweep()
        path = os.path.join(DIR, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        with NAMES.lock:
            NAMES.pending.add(name)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            cls.unlink_name(name)
            raise
        finally:
            os.close(fd)
        return cls(name, size, mm)

    @classmethod
    def attach(cls, name: str, size: int) -> Segment:
        path = os.path.join(DIR, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"shared-memory segment {path} is not there: this rank and the host's first "
                "rank do not share /dev/shm (mark separate hosts with DT_HOST, or turn the "
                "shared-memory wire off with DT_TRANSPORT=torch)") from None
        try:
            have = os.fstat(fd).st_size
            if have != size:
                raise RuntimeError(f"shared-memory segment {path} has {have} bytes, expected {size}")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, size, mm)

    def unlink(self) -> None:
        """Remove the name (the mapping stays valid for everyone who has it)."""
        self.unlink_name(self.name)

    @staticmethod
    def unlink_name(name: str) -> None:
        with NAMES.lock:
            NAMES.pending.discard(name)
        try:
            os.unlink(os.path.join(DIR, name))
        except FileNotFoundError:
            pass


atexit.register(NAMES.reset)
