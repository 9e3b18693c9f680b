"""`dt tune`: measure this machine's alpha, beta and gamma for a group.

    dt tune --world 4

The cost model (dt/cost/time.py) prices a collective as
steps * alpha + bytes * beta + reduced bytes * gamma. Three micro-benchmarks
measure the three figures on `--world` processes, all ranks at once (on a
shared machine the ranks compete for the same cores, and the figures should
say so):

- ping-pong: rank 0 and rank 1 bounce one element; half the round trip is
  the one-way latency of a message (printed for reference);
- ring exchange: every rank sends n bytes to its right neighbour while
  receiving n from its left, which is exactly one step of a ring, a doubling
  or a tree algorithm. A 1-element exchange gives alpha (the time of one
  step: a latency, timed as below); the slope of the time over
  n = 256 KB .. 16 MB gives beta;
- reduction: every rank adds two n-byte float32 buffers; the slope gives gamma
  (dt/bench/harness.py, which the scaling study calls too);
- the algorithm sweep (unless --no-sweep): every algorithm of all_reduce,
  broadcast, all_gather_into_tensor and reduce_scatter_tensor timed from 1 KiB
  to 64 MiB. auto prefers this measured table to the model's prediction where
  it has one (same backend and world size), as MPI libraries' tuned decision
  files do: the model explains the switch points, the table records them.

Both wires (--transport both, the default): the torch wire's figures are
saved under the backend ("gloo"), the shared-memory wire's under "shm", with
two more figures for its load/store algorithms: `sync`, the time of one
synchronisation of the group (a one-shot barrier), and `mem`, the slope of
a memcpy by every rank at once (1 to 16 MiB: out of cache, as big buffers are).

Latencies (alpha, sync, the ping-pong) are bursts of back-to-back calls, the
median of --reps bursts, measured --repeats (5) times: the figure is the fastest
repeat (noise only adds to a latency), its spread the middle repeat over it
(robust to a slow repeat or two under a passing load), printed and saved with
it beside the range (slowest / fastest; dt/tools/tune_curves.latency_of). A run
that finds figures saved under the same key prints its latencies over theirs:
the spread between runs. They are timed in turns
with whole 4-byte all-reduces (recursive doubling; one-shot on shared
memory), which they may not exceed.

Noisy or inconsistent figures are refused, not saved (exit 1; --force saves
them anyway, with the warnings): every curve (exchange time, memcpy time,
reduction time over size) must grow with size, each point at least (1 - 25%)
of the one before it (a curve that fails is measured again, up to --attempts
times); alpha may not exceed a whole 4-byte all-reduce, nor sync a whole
one-shot all-reduce, by more than 25%; a latency's spread (its middle repeat
over its fastest) may not exceed --max-spread (2). A loaded machine once saved alpha = 3.67 ms, and a sync of
878 us beside a one-shot all-reduce of 170 us. Figures that pass but differ
from the ones saved before by more than --max-spread are saved with a
warning naming both.

Across hosts (a group spanning hosts, e.g. under torchrun on two machines)
each link level is also timed on its own pair, two ranks of one host and two
of two hosts (dt/tools/tune_levels.py), and saved with the figures as
"levels": {"intra": {alpha, beta}, "inter": {alpha, beta}}, what the
two-level model (dt.cost.levels) and `auto` across hosts price with.

The figures go to a small JSON file in the user's cache directory
($XDG_CACHE_HOME/dt/tune.json, else ~/.cache/dt/tune.json; dt.cost.machine),
keyed by backend and world size (by topology, "gloo:2x2", across hosts),
where algorithm="auto" and `dt model --measured` find them. `dt tune --show`
lists them, `dt tune --reset` deletes them (dt/tools/tune_saved.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

from dt import args as args_
from dt import record
from dt.bench.harness import (
    REDUCE_SIZES,
    BenchCase,
    reduction_seconds_per_byte,
    slope,
    time_calls,
)
from dt.cost import machine
from dt.device import DEVICES, backend_for
from dt.tools import tune_saved
from dt.tools.tune_compute import after_tune
from dt.tools.tune_curves import (
    EXCHANGE_SIZES,
    MAX_SPREAD,
    REPEATS,
    Latency,
    between_runs,
    drifted,
    inconsistent,
    latencies,
    median_time,
    steady_curve,
    unsteady,
)

__all__ = ["main", "measure", "measure_shared", "measure_winners", "unsteady"]

# ---------------------------------------------------------------------------
# The micro-benchmarks (run on every rank).
# ---------------------------------------------------------------------------


WHOLE_STEP = "whole all-reduce"
WHOLE_ONE_SHOT = "whole one-shot all-reduce"


def _check_calls(g: Any) -> dict[str, Any]:
    """Whole 4-byte all-reduces, timed with the latencies: what alpha and sync may not exceed.

    WHOLE_STEP: the all-reduce with the fewest message steps on this wire
    (recursive doubling: lg p, one at p = 2); WHOLE_ONE_SHOT: one sync, then
    4-byte reads (shared memory only). Validation is off while they run.
    """
    import torch

    import dt

    zero = torch.zeros(1)  # zeros: a sum of many calls stays finite
    calls = {WHOLE_STEP: lambda: dt.all_reduce(zero, group=g, algorithm="recursive_doubling")}
    if g.links.board is not None:
        calls[WHOLE_ONE_SHOT] = lambda: dt.all_reduce(zero, group=g, algorithm="one_shot")
    return calls


def _whole(g: Any, timed: dict[str, Latency]) -> dict[str, Any]:
    from dt.cost import formula

    whole: dict[str, Any] = {"step": timed[WHOLE_STEP].seconds, "algorithm": "recursive_doubling",
                             "steps": formula("all_reduce", "recursive_doubling", 4, g.size)[0]}
    if WHOLE_ONE_SHOT in timed:
        whole["one_shot"] = timed[WHOLE_ONE_SHOT].seconds
    return whole


def measure(reps: int = 20, group: Any = None, attempts: int = 3,
            repeats: int = REPEATS) -> dict[str, Any]:
    """Run the three micro-benchmarks on `group` (its wire); every rank returns them.

    Latencies (the ping-pong, alpha, and on shared memory sync) are bursts of
    back-to-back calls, the fastest of `repeats` medians (dt/tools/tune_curves.py
    says why), timed in turns with the whole 4-byte all-reduces they may not
    exceed. The exchange curve's smallest point is alpha, so the curve rule
    holds it too.
    """
    import torch
    import torch.distributed as dist

    import dt
    from dt.transport import Comm, resolve_group, set_validation

    g = resolve_group(group)
    comm = Comm(g, "tune", "micro-benchmark")
    p, r = comm.size, comm.rank
    out: dict[str, Any] = {"world": p, "backend": dist.get_backend(), "spread": {}, "range": {}}

    # ping-pong between ranks 0 and 1
    one = torch.zeros(1)

    def pingpong() -> None:
        if r == 0:
            comm.send(one, 1)
            comm.recv(one, 1)
        elif r == 1:
            comm.recv(one, 0)
            comm.send(one, 0)

    # alpha: one step of a ring of one element, every rank sending and receiving at once;
    # sync: one synchronisation of a shared-memory group (a one-shot barrier)
    recv_one = torch.empty(1)
    calls = {"ping-pong": pingpong, "alpha": lambda: comm.exchange(one, (r + 1) % p, recv_one, (r - 1) % p),
             **_check_calls(g)}
    if g.links.board is not None:
        calls["sync"] = lambda: dt.barrier(group=g, algorithm="one_shot")
    set_validation(False)  # time the algorithms, not dt's argument check
    timed = latencies(calls, reps, repeats) if p > 1 else {}
    set_validation(None)
    step = timed.get("alpha", Latency(0.0, 1.0, ()))
    out["pingpong_one_way"] = timed["ping-pong"].seconds / 2 if p > 1 else 0.0
    out["alpha"], out["spread"]["alpha"], out["range"]["alpha"] = step.seconds, step.spread, step.range
    if p > 1:
        out["whole"] = _whole(g, timed)
    if "sync" in timed:
        sync = timed["sync"]
        out["sync"], out["spread"]["sync"], out["range"]["sync"] = sync.seconds, sync.spread, sync.range

    # the exchange curve from 256 KiB: beta is its slope
    def exchange_curve() -> dict[int, float]:
        points: dict[int, float] = {EXCHANGE_SIZES[0]: step.seconds}
        for nbytes in EXCHANGE_SIZES[1:]:
            send = torch.ones(max(1, nbytes // 4))
            recv = torch.empty_like(send)

            def one_step(send: torch.Tensor = send, recv: torch.Tensor = recv) -> None:
                comm.exchange(send, (r + 1) % p, recv, (r - 1) % p)

            fewer = reps if nbytes < 4 << 20 else max(5, reps // 3)  # big points are slow and steady
            points[send.numel() * 4] = median_time(one_step, fewer)
        return points

    exchange, out["noisy"] = steady_curve(exchange_curve, attempts) if p > 1 else ({4: 0.0}, None)
    out["exchange"] = {str(k): v for k, v in exchange.items()}
    out["beta"] = slope({k: v for k, v in exchange.items() if k >= 1 << 18})

    # reduction: a + b into a, the harness's gamma (the scaling study measures it the same way)
    reduction = reduction_seconds_per_byte(REDUCE_SIZES, reps)
    out["reduce"] = {str(k): v for k, v in reduction.times.items()}
    out["gamma"] = reduction.gamma
    return out


MEMCPY_SIZES = (1 << 20, 4 << 20, 16 << 20)


def measure_shared(reps: int, group: Any, attempts: int = 3) -> dict[str, Any]:
    """A shared-memory group's memcpy figure: mem (s/B), the slope of a copy by every rank at once.

    (Its sync is timed with the other latencies, by `measure`.)
    """
    import torch

    out: dict[str, Any] = {}

    def memcpy_curve() -> dict[int, float]:
        points = {}
        for nbytes in MEMCPY_SIZES:
            src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
            points[nbytes] = median_time(lambda s=src, d=dst: d.copy_(s), max(5, reps // 2))
        return points

    curve, why = steady_curve(memcpy_curve, attempts)
    out["memcpy"] = {str(k): v for k, v in curve.items()}
    out["mem"] = slope(curve)
    out["noisy_mem"] = why
    return out


# The measured decision table: each candidate algorithm timed at each size.
SWEEP_COLLECTIVES = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor")
SWEEP_SIZES = tuple(1024 * 4**k for k in range(9))  # 1 KiB .. 64 MiB
SWEEP_ROUNDS = 2  # the sweep run twice, the lower median kept per algorithm and size


def measure_winners(sizes: tuple[int, ...] = SWEEP_SIZES, reps: int = 5,
                    collectives: tuple[str, ...] = SWEEP_COLLECTIVES, group: Any = None,
                    shared_memory: bool = False) -> dict[str, Any]:
    """Time every candidate algorithm at every size; the fastest per size is the table.

    The cost model's switch points are only as good as its three figures; on a
    machine whose cores are shared (or whose network is not a clean
    alpha-beta link) the measured crossover can sit far from the predicted
    one. This records, per collective and size, the median over `reps` of the
    slowest rank's time for each algorithm, the algorithms taking turns in a
    rotating order so drifting load hits them alike, the whole sweep run
    SWEEP_ROUNDS times, each algorithm keeping its lowest median (noise only adds time: one
    burst of load can make a sub-millisecond call ten times slower, and auto would then run
    the wrong algorithm in every layer that makes that call).
    Every rank returns the same table (the times are maxed over ranks before
    anyone compares them).
    """
    import torch

    import dt
    from dt.collectives import auto
    from dt.transport import set_validation

    set_validation(False)
    best: dict[tuple[str, int], dict[str, float]] = {}
    for _ in range(SWEEP_ROUNDS):  # the whole sweep again: a burst does not hit one size twice
        for collective in collectives:
            algos = auto.candidates(collective, shared_memory)
            for nbytes in sizes:
                case = BenchCase(collective, max(1, nbytes // 4))
                calls = {a: case.call(a, group=group) for a in algos}
                # the first call of each warms up; every rank then takes each call's slowest rank
                mine = time_calls(calls, reps, warmup=1, reset=case.reset)
                slowest = torch.tensor([mine[a] for a in algos], dtype=torch.float64)
                dt.all_reduce(slowest, op=dt.ReduceOp.MAX, algorithm="naive")
                kept = best.setdefault((collective, nbytes), {})
                for a, t in zip(algos, slowest.tolist()):
                    kept[a] = min(kept.get(a, float("inf")), statistics.median(t))
    table: dict[str, Any] = {}
    for (collective, nbytes), medians in best.items():
        table.setdefault(collective, []).append([nbytes, min(sorted(medians), key=medians.get), medians])
    return table


def _worker(reps: int, sweep: bool, sweep_reps: int, max_bytes: int, wires: list[str],
            attempts: int, repeats: int = REPEATS, terms: str = "full") -> dict[str, Any]:
    """Every figure of every wire on this rank; terms: "full", "quick" (tests) or "none"."""
    from dt.bench.harness import wire_group
    from dt.tools.tune_terms import measure_terms
    from dt.transport import resolve_group, topology_of

    out = {}
    for wire in wires:
        g = wire_group(wire)
        shared = resolve_group(g).links.board is not None
        fig = measure(reps, g, attempts, repeats)
        if shared:
            fig.update(measure_shared(reps, g, attempts))
        if terms != "none":  # the model's other terms (dt.cost.overheads), each on its own benchmark
            fig["terms"] = measure_terms(g, reps, repeats, quick=terms == "quick")
        if sweep:
            sizes = tuple(s for s in SWEEP_SIZES if s <= max_bytes)
            fig["winners"] = measure_winners(sizes, sweep_reps, group=g, shared_memory=shared)
        wires = resolve_group(g).links.wires or ()  # across hosts: shm inside each, no shared board
        fig["wire"] = "shm" if shared or any(w.name == "shm" for w in wires) else "torch"
        topology = topology_of(resolve_group(g))
        fig["topology"] = topology.shape()  # figures are keyed by it across hosts
        if topology.host_count > 1:  # each level on its own pair (dt/tools/tune_levels.py)
            from dt.tools.tune_levels import measure_levels

            fig["levels"] = measure_levels(g, reps, attempts, repeats)
            if terms != "none":  # the messages' terms again between two hosts (rank 0 and the first away)
                away = next(q for q, h in enumerate(topology.hosts) if h != topology.hosts[0])
                fig["terms_inter"] = measure_terms(g, reps, repeats, terms == "quick", (0, away), False)
        out[wire] = fig
    return out


def group_figures(results: list[dict[str, Any]], wire: str) -> dict[str, Any]:
    """The group's figures from every rank's: the slowest rank's (a step waits for the last one).

    Latencies, whole calls and spreads too, so the consistency rule compares
    like with like; taken the same way on every run.
    """
    fig: dict[str, Any] = dict(results[0][wire])
    for key in ("alpha", "beta", "gamma", "pingpong_one_way", "sync", "mem"):
        if key in fig:
            fig[key] = max(res[wire][key] for res in results)
    for part in ("whole", "spread", "range"):
        if part in fig:
            fig[part] = {k: (max(res[wire][part][k] for res in results) if isinstance(v, float) else v)
                         for k, v in fig[part].items()}
    fig["backend"] = "shm" if fig["wire"] == "shm" else fig["backend"]
    if "terms" in fig and "mem" in fig:  # a load/store reduction's reads are in its add (dt.cost.overheads)
        fig["terms"] = dict(fig["terms"], fused=fig["mem"])
    if "levels" in fig:  # across hosts: each level's pair, the slower end of each
        from dt.cost.levels import nics_from
        from dt.tools.tune_levels import combine

        fig["levels"] = combine([res[wire].get("levels", {}) for res in results])
        fig["spread"].update({f"{level} pair alpha": lv["spread"] for level, lv in fig["levels"].items()
                              if "spread" in lv})
        rails, inter = fig["levels"].get("rails"), fig["levels"].get("inter")
        if rails and inter:  # a host's ranks sharing NICs see a slower beta when all send
            fig["nics"] = nics_from(inter["beta"], rails["beta"], rails["pairs"])
    return fig


def refusals(results: list[dict[str, Any]], wire: str, fig: dict[str, Any],
             max_spread: float = MAX_SPREAD) -> list[str]:
    """Why the group's figures may not be saved: a noisy curve on any rank, or inconsistent figures."""
    noisy = [why for res in results for why in (res[wire].get("noisy"), res[wire].get("noisy_mem"))
             if why] + [lv["noisy"] for lv in fig.get("levels", {}).values() if lv["noisy"]]
    return noisy + inconsistent(fig, max_spread=max_spread)


def _check_memory(parser: args_.Parser, args: argparse.Namespace) -> None:
    """The timings each count makes a rank keep at once: every algorithm's at one point (--reps,
    --sweep-reps), one median per repeat (--repeats) or per attempt (--attempts)."""
    from dt.collectives import ALGORITHMS

    algorithms = max(len(names) for names in ALGORITHMS.values())
    ranks = args_.ranks_on_this_host(args.world)
    counts = (("--reps", args.reps, algorithms), ("--sweep-reps", args.sweep_reps, algorithms),
              ("--repeats", args.repeats, 1), ("--attempts", args.attempts, 1))
    for option, count, per in counts:
        parser.check_memory(f"{option} {count:,}", count * per * args_.SAMPLE_BYTES, ranks,
                            f"{count * per:,} timings kept at once")


def main(argv: list[str] | None = None) -> int:
    parser = args_.Parser(
        prog="dt tune", description=__doc__.splitlines()[0],
        epilog=f"Figures are saved to {machine.cache_path()} ($XDG_CACHE_HOME/dt/tune.json, else "
               "~/.cache/dt/tune.json). dt tune --show lists them; dt tune --reset deletes them "
               "(auto and dt model then use the built-in defaults).")
    kept = parser.add_mutually_exclusive_group()
    kept.add_argument("--show", action="store_true", help="print the saved figures and where they are; "
                      "measure nothing")
    kept.add_argument("--reset", action="store_true", help="delete the saved figures; measure nothing")
    parser.add_argument("--world", type=args_.world, default=None,
                        help="processes in the group (default 2; under torchrun: the launched ones)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="cpu (gloo), cuda (NCCL, one GPU per rank) or auto (cuda when there is one)")
    parser.add_argument("--reps", type=args_.at_least(1), default=20,
                        help="repetitions per point (median)")
    parser.add_argument("--repeats", type=args_.at_least(1), default=REPEATS,
                        help=f"medians per latency figure (alpha, sync): the fastest is kept, the "
                             f"middle one over it (the spread) printed (default {REPEATS})")
    parser.add_argument("--max-spread", type=args_.positive, default=MAX_SPREAD,
                        help=f"refuse to save a latency whose middle repeat took more than this "
                             f"times its fastest (default {MAX_SPREAD:g})")
    parser.add_argument("--no-save", action="store_true", help="print only")
    parser.add_argument("--no-sweep", action="store_true",
                        help="skip timing every algorithm at every size (auto then uses the model only)")
    parser.add_argument("--sweep-reps", type=args_.at_least(1), default=5)
    parser.add_argument("--max-bytes", type=args_.size, default=SWEEP_SIZES[-1],
                        help="largest size of the algorithm sweep (default 64 MiB)")
    parser.add_argument("--transport", default="both", choices=("shm", "torch", "both"),
                        help="which wire(s) to measure (default both)")
    parser.add_argument("--attempts", type=args_.at_least(1), default=3,
                        help="re-measure a noisy curve this often")
    parser.add_argument("--force", action="store_true",
                        help="save even noisy or inconsistent figures (a warning says why)")
    parser.add_argument("--no-terms", action="store_true",
                        help="skip the model's other terms (per-message overhead, wake-up, shared "
                             "bandwidth, oversubscription: dt/tools/tune_terms.py)")
    parser.add_argument("--quick", action="store_true",
                        help="a short run (tests): --reps 3 --repeats 1, no sweep, fewer term points")
    record.add_option(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.repeats, args.no_sweep = min(args.reps, 3), 1, True
    if args.record is not None and (args.show or args.reset):
        parser.error("--record keeps a run that measures: not with --show or --reset")
    if args.show:
        return tune_saved.show()
    if args.reset:
        return tune_saved.reset()
    if (status := record.rerun("dt tune", argv, args.record, "tune", f"w{args.world or 2}")) is not None:
        return status

    import torch

    from dt.launcher import launch, resolve_world

    args.world = resolve_world(args.world, 2)
    _check_memory(parser, args)
    if args.world < 2:  # one rank sends no messages: its figures are the compute ones alone
        print("dt tune: one rank has no messages to time; measuring the matmul rates only", flush=True)
        record.headline("world 1: the matmul rates only (one rank has no messages to time)")
        return after_tune(args, 0)

    if not args.no_sweep:
        print(f"dt tune: timing every algorithm of {', '.join(SWEEP_COLLECTIVES)} from 1 KiB to "
              f"{args.max_bytes:,} B on {args.world} ranks (a minute or two)...", flush=True)
    backend = backend_for(args.device)
    wires = ["shm", "torch"] if args.transport == "both" else [args.transport]
    if backend == "nccl":
        wires = ["torch"]  # GPU tensors stay on NCCL: no shared-memory wire to measure
    results = launch(_worker, args.world, args.reps, not args.no_sweep, args.sweep_reps,
                     args.max_bytes, wires, args.attempts, args.repeats,
                     "none" if args.no_terms else "quick" if args.quick else "full",
                     backend=backend, timeout=3600)
    status, said = 0, []
    for wire in wires:
        fig = group_figures(results, wire)
        fig.update(cores=os.cpu_count(), torch=torch.__version__, host=platform.node(),
                   load=os.getloadavg()[0],
                   measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        tune_saved.report(fig)
        before = between_runs(fig, machine.entries().get(machine.key(fig)))
        if before:
            print(f"  {before}")
        why = refusals(results, wire, fig, args.max_spread)
        for reason in why:
            print(f"  WARNING: {reason}")
        if why and not args.force:
            print(f"  NOT saved: the figures are too noisy or inconsistent (the warnings above; load "
                  f"average {fig['load']:.1f} on {fig['cores']} cores). Run again when "
                  f"the machine is quieter, or --force to save them anyway.")
            status = 1
        elif not args.no_save and os.environ.get("LOCAL_RANK", "0") == "0":  # once per host
            for moved in drifted(fig, machine.entries().get(machine.key(fig)), args.max_spread):
                print(f"  WARNING: {moved}; saving the new figures (dt tune --show lists them)")
            print(f"  saved to {machine.save(fig)} (key {machine.key(fig)}"
                  f"{', despite the warnings: --force' if why else ''}); dt tune --show lists the "
                  f"saved figures, dt tune --reset deletes them")
        said.append(f"{wire} alpha {fig['alpha'] * 1e6:.1f} us, beta {fig['beta'] * 1e9:.3f} ns/byte"
                    + (", not saved" if why and not args.force else ""))
    record.headline(f"world {args.world}: " + "; ".join(said))
    return after_tune(args, status)  # the matmul rates (dt/tools/tune_compute.py)
