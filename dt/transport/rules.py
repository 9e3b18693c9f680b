"""NCCL's point-to-point rules, checked on the CPU so the suite catches a violation without a GPU.

On NCCL every operation of a communicator runs, in the order it was posted,
on one CUDA stream; a send completes only when its peer's matching receive
runs, and the sends and receives of one `batch_isend_irecv` (one grouped
call) run together. So a schedule is deadlock-free on NCCL exactly when
replaying every rank's batches, in posting order, on one in-order stream per
process group, lets every batch complete. gloo is forgiving where NCCL is
not (a receive posted ahead, or a send then a receive to the same peer as
two separate calls, both work on gloo and hang on NCCL).

Under `recording()` (or DT_NCCL_RULES=1) the transport

- posts the way it would on NCCL: each step's sends and receives as one
  batch, no receive posted ahead (every wire answers posts_ahead=False);
- records, per process, every batch it posts (stream = process group,
  operations = direction, peer, bytes, and where: collective, algorithm, step);
- records a violation when a tensor is on another device type than its
  group's (a CPU tensor on an NCCL group).

`simulate(traces)` then replays all ranks' records as NCCL would and reports
every deadlock (which batch each stuck rank is at, and what its peer is
doing instead) and every send whose size differs from its receive.
`pairs_first_used(traces)` reports a cyclic order of first use of rank
pairs, which deadlocks where pair communicators are created lazily.

The replay does not know about host-side waits between two process groups
(a rank blocking on group A before posting on group B): only each group's
own stream order is checked.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from dt import args

__all__ = ["RULES", "Batch", "Op", "Recorder", "Rules", "active", "pairs_first_used", "recording", "simulate"]


@dataclass(frozen=True)
class Op:
    kind: str  # "send" or "recv"
    peer: int  # global rank
    nbytes: int


@dataclass(frozen=True)
class Batch:
    stream: str  # the process group's name: one in-order stream per group
    ops: tuple[Op, ...]
    where: str  # "all_reduce[ring] step 3"


@dataclass
class Recorder:
    """One process's record: its rank, the batches it posted, and device violations."""

    rank: int = -1
    batches: list[Batch] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def batch(self, stream: str, ops: tuple[Op, ...], where: str) -> None:
        with self.lock:
            self.batches.append(Batch(stream, ops, where))

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)

    def take(self) -> dict:
        """What to send back to the checker (plain data, picklable)."""
        with self.lock:
            out = {"rank": self.rank, "batches": list(self.batches),
                   "violations": list(self.violations)}
            self.batches.clear()
            self.violations.clear()
        return out


def _from_environment() -> Recorder | None:
    # A bad value is refused at the door (dt.args.check_environment: the CLI, the
    # pool, dt.launcher.init) in one line; an import must not raise it as a traceback.
    try:
        return Recorder() if args.env_value("DT_NCCL_RULES", False) else None
    except ValueError:
        return None


@dataclass
class Rules:
    """The recorder in force in this process, if NCCL's rules are being checked: DT_NCCL_RULES's
    (a fresh one at each reset: a run's batches are not the next run's) or `recording()`'s.
    A Comm reads the attribute once, at its construction."""

    recorder: Recorder | None = field(default_factory=_from_environment)

    def reset(self) -> None:
        self.recorder = _from_environment()


RULES = Rules()


def active() -> Recorder | None:
    """The recorder in force in this process, if NCCL's rules are being checked (DT_NCCL_RULES=1)."""
    return RULES.recorder


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    """Post as on NCCL and record every batch (see the module docstring)."""
    import torch.distributed as dist

    prev = RULES.recorder
    RULES.recorder = Recorder(rank=dist.get_rank() if dist.is_initialized() else -1)
    try:
        yield RULES.recorder
    finally:
        RULES.recorder = prev


# ---------------------------------------------------------------------------
# The replay.
# ---------------------------------------------------------------------------


def simulate(traces: list[dict]) -> list[str]:
    """Replay every rank's batches on one in-order stream per (rank, group); return the problems.

    traces: one Recorder.take() per rank. Each rank's k-th send to rank b on
    a stream matches b's k-th receive from it there; an operation completes
    when the batch holding its match is at the head of the peer's stream; a
    batch completes when all its operations have. A round in which nothing
    completes while batches remain is a deadlock.
    """
    problems = [v for t in traces for v in t["violations"]]
    queues: dict[tuple[int, str], list[Batch]] = {}
    for t in traces:
        for b in t["batches"]:
            queues.setdefault((t["rank"], b.stream), []).append(b)
    # Number each op by its order among same-direction ops with the same peer on the stream.
    numbered: dict[tuple[int, str], list[list[tuple[str, int, int, int]]]] = {}
    for (rank, stream), batches in queues.items():
        seen: dict[tuple[str, int], int] = {}
        rows = []
        for b in batches:
            row = []
            for op in b.ops:
                k = seen.get((op.kind, op.peer), 0)
                seen[(op.kind, op.peer)] = k + 1
                row.append((op.kind, op.peer, k, op.nbytes))
            rows.append(row)
        numbered[(rank, stream)] = rows
    head = {key: 0 for key in queues}

    def at_head(rank: int, stream: str) -> list[tuple[str, int, int, int]]:
        i = head.get((rank, stream), 0)
        rows = numbered.get((rank, stream), [])
        return rows[i] if i < len(rows) else []

    done: set[tuple[int, str, str, int, int]] = set()  # (rank, stream, kind, peer, k)
    while True:
        moved = False
        for (rank, stream) in sorted(queues):
            i = head[(rank, stream)]
            if i >= len(queues[(rank, stream)]):
                continue
            for kind, peer, k, nbytes in numbered[(rank, stream)][i]:
                if (rank, stream, kind, peer, k) in done:
                    continue
                want = "recv" if kind == "send" else "send"
                match = [op for op in at_head(peer, stream) if op[0] == want and op[1] == rank and op[2] == k]
                if not match:
                    continue
                # Both batches are running (at their streams' heads): the pair completes.
                done.add((rank, stream, kind, peer, k))
                done.add((peer, stream, want, rank, k))
                if match[0][3] != nbytes:
                    problems.append(
                        f"{queues[(rank, stream)][i].where}: rank {rank} {kind}s {nbytes} bytes "
                        f"({kind} #{k + 1} with rank {peer}) but rank {peer} {want}s {match[0][3]}")
            if all((rank, stream, kind, peer, k) in done
                   for kind, peer, k, _ in numbered[(rank, stream)][i]):
                head[(rank, stream)] += 1
                moved = True
        if not moved:
            break
    stuck = [(key, head[key]) for key in sorted(queues) if head[key] < len(queues[key])]
    for (rank, stream), i in stuck:
        b = queues[(rank, stream)][i]
        waiting = ", ".join(f"{op.kind} {op.nbytes} B {'to' if op.kind == 'send' else 'from'} "
                            f"rank {op.peer}" for op in b.ops)
        peers = sorted({op.peer for op in b.ops})
        doing = []
        for q in peers:
            j = head.get((q, stream), 0)
            qb = queues.get((q, stream), [])
            if j < len(qb):
                what = ", ".join(f"{op.kind} rank {op.peer}" for op in qb[j].ops)
                doing.append(f"rank {q} is at {qb[j].where} ({what})")
            else:
                doing.append(f"rank {q} has posted nothing more")
        problems.append(f"deadlock on NCCL (group {stream}): rank {rank} waits in {b.where} "
                        f"[{waiting}] (its batch #{i + 1}); " + "; ".join(doing))
    return problems


def pairs_first_used(traces: list[dict]) -> list[str]:
    """Cyclic first use of rank pairs: a deadlock where pair communicators are created lazily.

    With lazy creation the first operation on a pair blocks both ranks until
    the pair's communicator exists; if rank a first uses (a, b) then (a, c),
    b first (b, c) then (a, b), and c first (a, c) then (b, c), each waits on
    the next. dt initialises communicators eagerly on NCCL (device_id), so
    this is a second line of defence.
    """
    order: dict[int, list[tuple[int, int]]] = {}
    for t in traces:
        seen: list[tuple[int, int]] = []
        for b in t["batches"]:
            for op in b.ops:
                pair = (min(t["rank"], op.peer), max(t["rank"], op.peer))
                if pair not in seen:
                    seen.append(pair)
        order[t["rank"]] = seen
    # Edge p -> q when some rank first uses p before q; a cycle is the deadlock.
    edges: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for seen in order.values():
        for a, b in zip(seen, seen[1:]):
            edges.setdefault(a, set()).add(b)
    state: dict[tuple[int, int], int] = {}

    def cyclic(p: tuple[int, int]) -> bool:
        state[p] = 1
        for q in edges.get(p, ()):
            if state.get(q) == 1 or (q not in state and cyclic(q)):
                return True
        state[p] = 2
        return False

    return ["rank pairs are first used in a cyclic order (deadlocks with lazily created pair "
            f"communicators): {order}"] if any(p not in state and cyclic(p) for p in list(edges)) else []
