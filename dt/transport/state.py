"""The transport's state, whole: everything dt.transport remembers between calls, and its reset.

Each concern keeps one typed dataclass beside the code that uses it (so the hot path
reads its own module's object, with no extra step), and they are gathered here:

    settings   settings.Settings        timeouts set by dt.set_timeout and the launcher,
                                         validation, the wire, DT_TIMEOUT as parsed,
                                         each process group's own timeout (kept)
    groups     group.Groups             resolve_group's view of each group, with its
                                         links: topology, wires, board, plans; the
                                         process groups shared_group made (kept)
    threads    asynchronous.CommThreads one communication thread per group
    liveness   liveness.FailureWatch    the failures heard, the waits a failure aborts,
                                         the channel they come by (kept)
    traffic    accounting.Recorders     the dt.traffic() blocks open, each thread's label
    segments   shm.segment.Names        /dev/shm names created and not yet unlinked
    rules      rules.Rules              NCCL's rules recorder: DT_NCCL_RULES's, a fresh one

`reset()` puts a process back where a new run starts: nothing set, no group connected,
no thread, no failure known, no record open, no segment name left, NCCL's rules recorder
as DT_NCCL_RULES says (a new one, empty). What it keeps is
marked (kept) above: facts of the process itself (its process groups, its watchdog's
channel), which outlive a run. dt's launcher calls it before each run, in a pool's worker
and under torchrun alike (dt.launcher.group.start_run, between_runs: the failures heard
stay); a test may too.
`rules.recording()` sets the recorder for its block and restores the one before on exit.
"""

from __future__ import annotations

from dataclasses import dataclass

from dt.transport import accounting, asynchronous, group, liveness, rules, settings
from dt.transport.shm import segment

__all__ = ["STATE", "TransportState", "reset"]


@dataclass(frozen=True)
class TransportState:
    """The transport's state in one object (see the module doc for what each part holds)."""

    settings: settings.Settings
    groups: group.Groups
    threads: asynchronous.CommThreads
    liveness: liveness.FailureWatch
    traffic: accounting.Recorders
    segments: segment.Names
    rules: rules.Rules

    def reset(self, between_runs: bool = False) -> None:
        """Back to a new run's state; threads stop before their groups are forgotten.

        between_runs (dt's launcher, at a run's start): the failures heard are kept. A peer
        that starts the run first may already have failed and said so; forgetting it here
        would leave this rank deaf to it, waiting in the group's first connection. (A
        process that heard a failure is never given another run: its pool starts anew;
        under torchrun the run's WorkerError ends the tool, and a run after it anyway
        refuses at its first wait on the failed rank, PeerFailed, instead of hanging.)
        """
        self.threads.reset()
        self.groups.reset()
        self.settings.reset()
        if not between_runs:
            self.liveness.reset()
        self.traffic.reset()
        self.segments.reset()
        self.rules.reset()


STATE = TransportState(settings.SETTINGS, group.GROUPS, asynchronous.THREADS, liveness.WATCH,
                       accounting.RECORDERS, segment.NAMES, rules.RULES)


def reset(between_runs: bool = False) -> None:
    """Put this process's transport back where a new run starts (TransportState.reset)."""
    STATE.reset(between_runs)
