"""Exercise: what a ring all-reduce costs, by hand, checked against `dt model`'s numbers."""

from __future__ import annotations

from typing import Any

from dt import cost
from dt.learn.exercises import Exercise
from dt.units import fmt_bytes, fmt_time, parse_rate, parse_size, parse_time

WORLD, BANDWIDTH, LATENCY, SIZES = 8, "450GB/s", "5us", ("1GB", "1MB")
MODEL = (f"dt model all_reduce --size {','.join(SIZES)} --world {WORLD} --bandwidth {BANDWIDTH} "
         f"--latency {LATENCY} --algorithms ring")
TOLERANCE = 0.02  # relative: room for rounding by hand


def _estimate(size: str) -> cost.Estimate:
    # What `dt model` prints for the ring (dt.tools.whatif asks dt.cost.estimate the same question).
    return cost.estimate("all_reduce", "ring", parse_size(size), WORLD, alpha=parse_time(LATENCY),
                         beta=1 / parse_rate(BANDWIDTH))


def expected() -> dict[str, Any]:
    big, small = (_estimate(s) for s in SIZES)
    return {"steps": big.steps, "bytes_per_rank": big.bytes, "time_1GB": big.total,
            "time_1MB": small.total, "latency_bound_1MB": small.latency > small.bandwidth}


def check(values: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """(name, right?, what the model says) for each answer in the learner's file."""
    want, out = expected(), []
    big, small = (_estimate(s) for s in SIZES)
    why = {
        "steps": f"the ring takes {big.steps} sequential steps on {WORLD} ranks "
                 "(a reduce-scatter lap and an all-gather lap)",
        "bytes_per_rank": f"{fmt_bytes(big.bytes)} ({big.bytes:,.0f} B) on the critical path",
        "time_1GB": f"{fmt_time(big.latency)} latency + {fmt_time(big.bandwidth)} bandwidth = "
                    f"{fmt_time(big.total)}",
        "time_1MB": f"{fmt_time(small.latency)} latency + {fmt_time(small.bandwidth)} bandwidth = "
                    f"{fmt_time(small.total)}",
        "latency_bound_1MB": f"at 1 MB the latency term is {fmt_time(small.latency)} and the bandwidth "
                             f"term {fmt_time(small.bandwidth)}",
    }
    for name, right in want.items():
        got = values.get(name)
        if got is None:
            out.append((name, False, f"not answered yet; {why[name]}"))
        elif isinstance(right, bool):
            out.append((name, got is right or got == right, why[name]))
        elif isinstance(got, (int, float)) and not isinstance(got, bool):
            ok = abs(got - right) <= TOLERANCE * abs(right)
            out.append((name, ok, ("" if ok else f"you have {got:g}; ") + why[name]))
        else:
            out.append((name, False, f"{got!r} is not a number; {why[name]}"))
    return out


EXERCISE = Exercise(
    name="cost_estimate",
    title="What a ring all-reduce costs: the alpha-beta model by hand",
    function="",
    see=MODEL,
    check=check,
    statement=f"""\
A ring all-reduce runs on {WORLD} ranks. Each rank's link carries {BANDWIDTH}
(1/beta), and every sequential message step costs {LATENCY} of latency
(alpha); reduction is free. Answer in the file below (Python arithmetic is
fine, times in seconds): how many sequential steps the ring takes, how many
bytes each rank sends for S = 1 GB (1e9 bytes), how long the all-reduce takes
for S = 1 GB and for S = 1 MB, and whether at 1 MB it is latency-bound (the
steps cost more than the bytes). `dt judge cost_estimate.py` checks each
answer (to {TOLERANCE:.0%}) against the model `dt model` prints.""",
    hints=(
        "The ring is a reduce-scatter lap then an all-gather lap, p-1 steps each.",
        "Per lap each rank sends every chunk but one: (p-1) of the p chunks of S/p bytes.",
        "time = steps * alpha + bytes_per_rank * beta, with beta = 1 / (450e9 bytes/s).",
        "At 1 MB the bytes take microseconds; count what the steps cost.",
    ),
)
