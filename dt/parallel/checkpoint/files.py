"""The files of a checkpoint directory: names, the lock, the manifest, and their checks.

Nothing here talks to another rank; sharded.py says which rank calls what.
Every failure is a CheckpointError of one line that names the file and
what is wrong with it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import socket
from typing import Any

__all__ = ["FORMAT", "MANIFEST", "VERSION", "CheckpointError", "DirectoryLock", "check_directory",
           "check_file", "clean_stale", "commit", "describe_os_error", "make_private_dir", "prune",
           "rank_file", "read_manifest", "sha256", "step_dirs", "step_name", "write_new"]

FORMAT = "dt-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
LOCK = ".lock"
_STEP = re.compile(r"^step-(\d{8})$")
_PRIVATE = re.compile(r"^\.step-\d{8}\.(tmp|old)-")  # a writer's directory, in progress or replaced
_RANK_FILE = re.compile(r"^rank-\d{5}\.pt$")
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message (one line) names the file and why."""


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def _why(e: OSError) -> str:
    return e.strerror or str(e)


# -- the directory ------------------------------------------------------------------------------
def check_directory(path: str) -> str:
    """Make sure checkpoints can be written under `path` before any training; returns it absolute.

    `path` is created if its parent exists (never a chain of parents: a typo
    there should not silently make a new tree). A file where the directory
    should be, a missing parent, or a directory this process cannot write
    into is a CheckpointError now, not after the run has trained.
    """
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise CheckpointError(f"checkpoint directory {path}: is a file, not a directory (dt "
                              f"checkpoints are directories of step-NNNNNNNN/ folders)")
    parent = os.path.dirname(path)
    if not os.path.isdir(path):
        if not os.path.isdir(parent):
            what = "is not a directory" if os.path.exists(parent) else "does not exist"
            raise CheckpointError(f"checkpoint directory {path}: its parent {parent} {what}")
        try:
            os.makedirs(path, exist_ok=True)  # exist_ok: every rank under torchrun checks at once
        except OSError as e:
            raise CheckpointError(f"checkpoint directory {path}: cannot create it: {_why(e)}") from None
    probe = os.path.join(path, f".probe-{os.getpid()}-{secrets.token_hex(4)}")
    try:  # os.access says yes to root on a read-only mount; writing a file is the real test
        with open(probe, "xb") as f:
            f.write(b"dt")
    except OSError as e:
        raise CheckpointError(f"checkpoint directory {path}: cannot write into it: {_why(e)}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return path


class DirectoryLock:
    """An exclusive lock on a checkpoint directory, held by one process of one job.

    flock(2) on `<dir>/.lock`: the kernel drops it when the holder exits, by
    any means (SIGKILL included), so a dead job never leaves a stale lock,
    and a second job that tries to write into the directory is refused at
    start-up instead of racing the first over the same files.
    """

    def __init__(self, path: str):
        self.path = os.path.join(path, LOCK)
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise CheckpointError(f"checkpoint directory {os.path.dirname(self.path)}: in use by another "
                                  f"job ({holder}); two jobs must not write one checkpoint") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def step_dirs(path: str) -> list[tuple[int, str]]:
    """(step, full path) of every step-NNNNNNNN entry under `path`, newest first."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), os.path.join(path, n)) for n in names if (m := _STEP.match(n))]
    return sorted(found, reverse=True)


def clean_stale(path: str) -> list[str]:
    """Remove directories left by writers that died mid-save. Only the lock holder may call this."""
    removed = []
    for n in os.listdir(path):
        if _PRIVATE.match(n):
            shutil.rmtree(os.path.join(path, n), ignore_errors=True)
            removed.append(n)
    return removed


def prune(path: str, keep: int) -> None:
    """Keep the newest `keep` step directories, remove the older ones."""
    for _, old in step_dirs(path)[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def make_private_dir(path: str, step: int) -> str:
    """A directory only this writer uses: .step-NNNNNNNN.tmp-<pid>-<random>."""
    private = os.path.join(path, f".{step_name(step)}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(private)
    return private


def write_new(path: str, data: bytes) -> None:
    """Write a file that must not exist yet, and push it to the disk before returning."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(private: str, final: str) -> None:
    """Publish a finished private directory as `final`, atomically.

    rename(2) of a directory is atomic: a reader sees the step directory
    complete, or not at all. A step directory already there (a step saved
    again after a restart) is first moved aside, then removed.
    """
    _fsync_dir(private)
    parent = os.path.dirname(final)
    old = None
    if os.path.exists(final):
        old = os.path.join(parent, f".{os.path.basename(final)}.old-{os.getpid()}-{secrets.token_hex(4)}")
        os.rename(final, old)
    os.rename(private, final)
    _fsync_dir(parent)
    if old:
        shutil.rmtree(old, ignore_errors=True)


# -- integrity ----------------------------------------------------------------------------------
def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def read_manifest(step_dir: str) -> dict[str, Any]:
    """The manifest of one step directory, checked to be dt's and whole."""
    path = os.path.join(step_dir, MANIFEST)
    if not os.path.isdir(step_dir):
        raise CheckpointError(f"checkpoint {step_dir}: is not a directory")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path}: missing") from None
    except OSError as e:
        raise CheckpointError(f"checkpoint file {path}: cannot read it: {_why(e)}") from None
    if not raw:
        raise CheckpointError(f"checkpoint file {path}: empty")
    try:
        m = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        what = f"{e.msg} at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) \
            else "not text"
        raise CheckpointError(f"checkpoint file {path}: not a dt manifest (not JSON: {what}; "
                              f"truncated or foreign)") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        got = m.get("format") if isinstance(m, dict) else type(m).__name__
        raise CheckpointError(f"checkpoint file {path}: not a dt manifest (format {got!r}, "
                              f"expected {FORMAT!r})")
    if m.get("version") != VERSION:
        raise CheckpointError(f"checkpoint file {path}: format version {m.get('version')!r}, this dt "
                              f"reads version {VERSION}")
    for key, kind in (("step", int), ("files", dict), ("tensors", dict), ("layout", dict), ("meta", dict)):
        if not isinstance(m.get(key), kind):
            raise CheckpointError(f"checkpoint file {path}: manifest field {key!r} is missing or not "
                                  f"a {kind.__name__}")
    try:
        for name, entry in m["files"].items():
            if not _RANK_FILE.match(name) or not isinstance(entry, dict):
                raise CheckpointError(f"checkpoint file {path}: lists a foreign file {name!r}")
        for name, t in m["tensors"].items():
            if any(c["file"] not in m["files"] for c in t["chunks"]):
                raise CheckpointError(f"checkpoint file {path}: tensor {name!r} points outside its files")
            if sum(math.prod(c["lengths"]) for c in t["chunks"]) != math.prod(t["shape"]):
                raise CheckpointError(f"checkpoint file {path}: tensor {name!r} is not covered by its "
                                      f"chunks")
    except (KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"checkpoint file {path}: malformed manifest ({type(e).__name__}: {e})") \
            from None
    return m


def check_file(step_dir: str, name: str, entry: dict[str, Any]) -> None:
    """One shard file against its manifest entry: present, the right size, the right bytes."""
    path = os.path.join(step_dir, name)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path}: missing") from None
    want = entry.get("bytes")
    if size == 0 and want:
        raise CheckpointError(f"checkpoint file {path}: empty (the manifest says {want} bytes)")
    if size < want:
        raise CheckpointError(f"checkpoint file {path}: truncated ({size} of {want} bytes)")
    if size > want:
        raise CheckpointError(f"checkpoint file {path}: {size} bytes, the manifest says {want}")
    try:
        digest = _file_sha256(path)
    except OSError as e:
        raise CheckpointError(f"checkpoint file {path}: cannot read it: {_why(e)}") from None
    if digest != entry.get("sha256"):
        raise CheckpointError(f"checkpoint file {path}: corrupt (sha256 {digest[:12]}..., the manifest "
                              f"says {str(entry.get('sha256'))[:12]}...)")


def describe_os_error(what: str, e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return f"{what}: no space left on the device"
    return f"{what}: {_why(e)}"
