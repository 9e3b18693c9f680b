"""FSDP's prefetch: the next unit's all-gather issued behind the current unit's compute, as FSDP2 does.

Without it each unit's all-gather blocks right before the unit runs, in forward and again in
backward: a step waits for every one of them. With it:

    forward   when unit i starts, the all-gather of the unit after it (in the order the last
              forward started them) is issued asynchronously, so it travels while unit i
              computes; that unit then waits for it (often not at all) instead of gathering.
    backward  when unit j's regather is due (its output's gradient has arrived), the regather
              of the unit before it (in the order this forward finished them: FSDP2's reverse
              post-forward order, the order backward reaches them) is issued the same way.

At most one gather ahead: one more gathered unit held at a time, FSDP2's default limit
(dt.parallel.zero.memory.fsdp_gathered_formula counts it). The gathers are the ones the
unit would make anyway, moved earlier: no byte is added or dropped. Each rank issues the same
gathers in the same order (every rank runs the same units in the same order), and a
collective this rank calls on the group meanwhile (a unit's reduce-scatter) queues behind the
one in flight (dt.transport.submit): the group's calls stay matched across ranks. A unit
that runs out of the recorded order gathers for itself, after the one in flight; a gather no
unit took (a unit whose output got no gradient) is waited for and freed at the next forward.

The gathers run on the group's communication thread (async_op=True), charged to data
parallel's label as the blocking ones are; only the wait for one is the step's
communication time (accounting.blocking).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from dt.collectives import all_gather
from dt.parallel.data_parallel import LABEL as DATA_LABEL
from dt.transport import Work, charged_to
from dt.transport.accounting import blocking

__all__ = ["Ahead", "Finished", "Prefetch"]


@dataclass
class Ahead:
    """One all-gather issued ahead: the unit's, for which use (`key`), into `full`, still running."""

    unit: Any  # dt.parallel.zero.fsdp's _Unit
    key: object  # a forward's list of started units, or a finished forward copy's `done` flag
    full: torch.Tensor
    work: Work


@dataclass
class Finished:
    """A unit's forward whose backward regathers: its copy (freed until then) and whether it has."""

    unit: Any
    full: torch.Tensor
    done: list[bool]  # [True] once its regather was made or taken (one per forward copy)


def gather_into(full: torch.Tensor, unit: Any, algorithm: str, async_op: bool = False) -> Any:
    """All-gather `unit`'s shards into `full` (into .data: refilling a storage autograd saved
    must not bump the version it checks), charged to data parallel's label. Returns `full`,
    or with async_op the gather's Work, at once."""
    with charged_to(DATA_LABEL, algorithm):
        work = all_gather(list(full.data.split(unit.sizes)), unit.shard.detach(), group=unit.group,
                          algorithm=algorithm, async_op=async_op)
    return work if async_op else full


def _empty(unit: Any) -> torch.Tensor:
    """A flat buffer for `unit`'s whole parameters."""
    return torch.empty(sum(unit.sizes), dtype=unit.shard.dtype, device=unit.shard.device)


def refill(full: torch.Tensor) -> torch.Tensor:
    """Give a freed copy (storage resized to 0 after its forward) its bytes back, for backward."""
    full.untyped_storage().resize_(full.numel() * full.element_size())
    return full


def _free(full: torch.Tensor) -> None:
    full.untyped_storage().resize_(0)


class Prefetch:
    """One FSDP module's gathers ahead: the forward order it records, the one gather in flight."""

    def __init__(self, algorithm: str, enabled: bool = True):
        self.algorithm, self.enabled = algorithm, enabled
        self.order: list[Any] = []  # the units in the order the last whole forward started them
        self.started: list[Any] | None = None  # this forward's units as they start, while one runs
        self.finished: list[Finished] | None = None  # and its copies backward regathers, as they finish
        self.ahead: Ahead | None = None
        self.issued = 0  # gathers issued ahead, and those a unit then took (the rest were dropped)
        self.taken = 0

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """One forward of the FSDP module: the units it starts are recorded, in order."""
        self._drop()
        started: list[Any] = []
        self.started, self.finished = started, []
        try:
            yield
            self.order = started
        finally:
            self.started = self.finished = None

    def finishing(self) -> list[Finished]:
        """The list a unit finishing its forward now joins: this forward's; outside a forward of the
        module (the unit's module called on its own) a new one, with nothing before it to prefetch."""
        return self.finished if self.finished is not None else []

    def before_forward(self, unit: Any) -> torch.Tensor:
        """`unit`'s gathered parameters for the forward starting now: the gather issued ahead for
        it, or one made now; then the next unit's is issued, before this one computes (outside a
        forward of the module, as in a recomputed block's rerun in backward, none is)."""
        started = self.started
        mine = self._take(unit, started)
        full = mine.full if mine is not None else gather_into(_empty(unit), unit, self.algorithm)
        if started is not None:
            started.append(unit)
            i = len(started) - 1
            if i + 1 < len(self.order) and self.order[i] is unit:
                nxt = self.order[i + 1]
                self._issue(nxt, started, lambda: _empty(nxt))
        if mine is not None:  # after the next is issued: it queues right behind this one
            self._wait(mine)
        return full

    def before_backward(self, finished: list[Finished], k: int) -> None:
        """finished[k]'s regather (its output's gradient has arrived): the one issued ahead for
        it, or one made now; then the regather of the nearest unit before it still due is issued."""
        entry = finished[k]
        entry.done[0] = True
        mine = self._take(entry.unit, entry.done)
        if mine is None:
            gather_into(refill(entry.full), entry.unit, self.algorithm)
        before = next((f for f in reversed(finished[:k]) if not f.done[0]), None)
        if before is not None:
            self._issue(before.unit, before.done, lambda: refill(before.full))
        if mine is not None:
            self._wait(mine)

    def _issue(self, unit: Any, key: object, buffer: Callable[[], torch.Tensor]) -> None:
        if not self.enabled or self.ahead is not None:  # one gather ahead at most
            return
        full = buffer()
        work = gather_into(full, unit, self.algorithm, async_op=True)
        self.ahead = Ahead(unit, key, full, work)
        self.issued += 1

    def _take(self, unit: Any, key: object) -> Ahead | None:
        ahead = self.ahead
        if ahead is None or ahead.unit is not unit or ahead.key is not key or key is None:
            return None
        self.ahead = None
        self.taken += 1
        return ahead

    @staticmethod
    def _wait(ahead: Ahead) -> torch.Tensor:
        blocking(ahead.work.wait)  # the exposed part: the step's communication time
        return ahead.full

    def _drop(self) -> None:
        """A gather no unit took: wait for it (the other ranks made it too) and free its copy."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            ahead.work.wait()
            _free(ahead.full)
