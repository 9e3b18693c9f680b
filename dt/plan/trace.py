"""Timelines as Chrome trace JSON (Perfetto, chrome://tracing): measured ranks and the prediction.

The measured run is process 1 (a thread per rank), the prediction process 2
(a thread per pipeline stage's rank), both starting at 0 for one step, so
the two line up: where their boxes part is where the model is wrong. The
measured step shown is the second (the first is warm-up).

TimelineRecorder is the measuring side: while `hooked()`, every synchronous wait
dt's transport charges to a step (dt.transport.accounting.blocking: the
wrapper every blocking collective and wait goes through) is recorded with
its start and end, named by the collectives whose byte counts it moved in
the innermost traffic() record open (the step keeps them open around its
pipeline and its gradient sync).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from dt.plan.step_model import Prediction

__all__ = ["TimelineRecorder", "write_trace"]


class TimelineRecorder:
    def __init__(self) -> None:
        self.spans: list[tuple[int, str, float, float]] = []  # (step, name, start, end), seconds
        self.bounds: list[tuple[float, float]] = []
        self._step = -1
        self._t0 = 0.0

    def begin(self, step: int) -> None:
        self._step, self._t0 = step, time.perf_counter()
        self._mark, self._mark_name = self._t0, ""  # no mark: no span (an overflow skipped the step)

    def mark(self, name: str) -> None:
        self._mark_name, self._mark = name, time.perf_counter()

    def end(self) -> None:
        now = time.perf_counter()
        if self._mark_name:
            self.spans.append((self._step, self._mark_name, self._mark - self._t0, now - self._t0))
        self.bounds.append((self._t0, now))

    def step_seconds(self) -> list[float]:
        return [end - start for start, end in self.bounds]

    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        """Wrap the transport's blocking waits for the block's duration (this process only)."""
        from dt.transport import accounting

        original = accounting.blocking

        def moved() -> dict[str, int]:
            if not accounting.open_records:  # blocking times nothing then: no span either
                return {}
            record = accounting.open_records[-1]  # the step's own (TrainStep keeps one open)
            return {name: counts.bytes_sent + counts.bytes_received + counts.calls
                    for name, counts in record.by_collective.items()}

        def timed(wait: Any) -> Any:
            before, start = moved(), time.perf_counter()
            try:
                return original(wait)
            finally:
                if self._step >= 0:  # named by the collectives whose counts the wait moved
                    after = moved()
                    changed = sorted(name for name, count in after.items() if count != before.get(name, 0))
                    name = "+".join(changed) or "wait"
                    self.spans.append((self._step, name, start - self._t0, time.perf_counter() - self._t0))

        accounting.blocking = timed
        try:
            yield
        finally:
            accounting.blocking = original


def _events(pid: int, tid: int, spans: list[tuple[str, float, float]]) -> list[dict[str, Any]]:
    """Chrome trace's complete events ("X") of (name, start, end) spans, in microseconds."""
    return [{"name": name, "cat": name.split(" ")[0], "ph": "X", "pid": pid, "tid": tid, "ts": start * 1e6,
             "dur": (end - start) * 1e6} for name, start, end in spans if end > start]


def write_trace(path: str, ranks: list[dict[str, Any]], predicted: Prediction) -> None:
    """Measured (every rank's second step) and predicted timelines in one trace file."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "measured (dt train)"}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "predicted (dt plan)"}}]
    step = 1 if all(len(run["steps"]) > 1 for run in ranks) else 0
    for run in ranks:
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": run["rank"],
                       "args": {"name": f"rank {run['rank']} (stage {run['stage']})"}})
        events += _events(1, run["rank"], [("step", 0.0, run["steps"][step])])
        events += _events(1, run["rank"], [(name, start, end) for of_step, name, start, end in run["spans"]
                                           if of_step == step])
    for rank, spans in predicted.timelines.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 2, "tid": rank,
                       "args": {"name": f"rank {rank}"}})
        events += _events(2, rank, [("step", 0.0, predicted.step)])
        named = [(span.kind + (f" ({span.label})" if span.label else ""), span.start, span.end)
                 for span in spans]
        events += _events(2, rank, named)
    with open(path, "w") as out:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, out)
