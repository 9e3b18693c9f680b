"""NCCL's point-to-point rules, checked here on the CPU (dt.transport.rules).

Every algorithm runs as it would on NCCL (each step's sends and receives as
one batch, nothing posted ahead), its result is compared with torch's
collective, and every rank's posted batches are replayed on one in-order
stream per group, as NCCL executes them: any deadlock, any send whose size
differs from its receive, any tensor on the wrong kind of device fails the test.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dt
from dt.collectives.registry import ALGORITHMS, is_alias
from dt.transport import rules
from dt.transport.rules import Batch, Op


def _trace(rank: int, *batches: tuple[str, tuple[tuple[str, int, int], ...]]) -> dict:
    return {"rank": rank, "violations": [],
            "batches": [Batch("g", tuple(Op(*op) for op in ops), where) for where, ops in batches]}


def test_replay_finds_the_1f1b_deadlock_and_passes_its_batched_fix():
    # Stage 0 queues send(activation) then recv(gradient); stage 1 the reverse order.
    bad = [_trace(0, ("send act", (("send", 1, 8),)), ("recv grad", (("recv", 1, 8),))),
           _trace(1, ("send grad", (("send", 0, 8),)), ("recv act", (("recv", 0, 8),)))]
    problems = rules.simulate(bad)
    assert len(problems) == 2 and all("deadlock on NCCL" in p for p in problems)
    assert "rank 0 waits in send act" in problems[0] and "rank 1 is at send grad" in problems[0]
    good = [_trace(0, ("tick", (("send", 1, 8), ("recv", 1, 8)))),
            _trace(1, ("tick", (("recv", 0, 8), ("send", 0, 8))))]
    assert rules.simulate(good) == []


def test_replay_finds_receives_posted_ahead_on_a_ring_of_three():
    ahead = [_trace(r, ("recv 0", (("recv", (r - 1) % 3, 4),)), ("recv 1", (("recv", (r - 1) % 3, 4),)),
                    ("send 0", (("send", (r + 1) % 3, 4),)), ("send 1", (("send", (r + 1) % 3, 4),)))
             for r in range(3)]
    assert len(rules.simulate(ahead)) == 3
    stepwise = [_trace(r, *[(f"step {s}", (("recv", (r - 1) % 3, 4), ("send", (r + 1) % 3, 4)))
                            for s in range(2)]) for r in range(3)]
    assert rules.simulate(stepwise) == []


def test_replay_reports_size_mismatch_and_device_violations():
    traces = [_trace(0, ("x", (("send", 1, 8),))), _trace(1, ("x", (("recv", 0, 4),)))]
    traces[0]["violations"].append("a cpu tensor on an nccl group")
    problems = rules.simulate(traces)
    assert problems[0] == "a cpu tensor on an nccl group"
    assert "rank 0 sends 8 bytes" in problems[1] and "rank 1 recvs 4" in problems[1]


def test_cyclic_first_use_of_pairs_is_reported():
    cyc = [_trace(0, ("a", (("send", 1, 1),)), ("b", (("send", 2, 1),))),
           _trace(1, ("a", (("send", 2, 1),)), ("b", (("recv", 0, 1),))),
           _trace(2, ("a", (("recv", 0, 1),)), ("b", (("recv", 1, 1),)))]
    assert rules.pairs_first_used(cyc)
    ordered = [_trace(r, ("a", (("send", (r + 1) % 3, 1),))) for r in range(2)]
    assert rules.pairs_first_used(ordered) == []


# ---------------------------------------------------------------------------
# Every registered algorithm, for real, under the rules.
# ---------------------------------------------------------------------------

SIZES = (0, 1, 7, 1003)


def _inputs(p: int, r: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float64) * (r + 1) + 1000 * r


def _case(collective: str, algorithm: str, n: int) -> tuple[list, list, rules.Recorder]:
    """(dt's outputs, torch's outputs, the record) for one call on this rank."""
    p, r = dist.get_world_size(), dist.get_rank()
    x = _inputs(p, r, n)
    last = p - 1
    if collective == "all_reduce":
        a, b = x.clone(), x.clone()
        with rules.recording() as rec:
            dt.all_reduce(a, algorithm=algorithm)
        dist.all_reduce(b)
        return [a], [b], rec
    if collective == "broadcast":
        a, b = x.clone(), x.clone()
        with rules.recording() as rec:
            dt.broadcast(a, src=last, algorithm=algorithm)
        dist.broadcast(b, src=last)
        return [a], [b], rec
    if collective == "reduce":
        a, b = x.clone(), x.clone()
        with rules.recording() as rec:
            dt.reduce(a, dst=last, algorithm=algorithm)
        dist.reduce(b, dst=last)
        return ([a], [b], rec) if r == last else ([], [], rec)
    if collective == "all_gather":  # uneven entries: rank i holds n + i elements
        mine = _inputs(p, r, n + r)
        a = [torch.empty(n + i, dtype=torch.float64) for i in range(p)]
        with rules.recording() as rec:
            dt.all_gather(a, mine, algorithm=algorithm)
        b = [_inputs(p, i, n + i) for i in range(p)]
        return a, b, rec
    if collective == "all_gather_into_tensor":
        a, b = torch.empty(n * p, dtype=torch.float64), torch.empty(n * p, dtype=torch.float64)
        with rules.recording() as rec:
            dt.all_gather_into_tensor(a, x, algorithm=algorithm)
        dist.all_gather_into_tensor(b, x)
        return [a], [b], rec
    if collective in ("reduce_scatter", "reduce_scatter_tensor"):
        full = torch.cat([_inputs(p, r, n) + j for j in range(p)])
        a, b = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
        with rules.recording() as rec:
            if collective == "reduce_scatter":
                dt.reduce_scatter(a, list(full.split(n)) if n else [full] * p, algorithm=algorithm)
            else:
                dt.reduce_scatter_tensor(a, full, algorithm=algorithm)
        dist.reduce_scatter_tensor(b, full)
        return [a], [b], rec
    if collective == "all_to_all":
        ins = [x + j for j in range(p)]
        a = [torch.empty(n, dtype=torch.float64) for _ in range(p)]
        with rules.recording() as rec:
            dt.all_to_all(a, ins, algorithm=algorithm)
        b = [_inputs(p, j, n) + r for j in range(p)]
        return a, b, rec
    if collective in ("gather", "scatter"):
        root = last
        if collective == "gather":
            a = [torch.empty(n, dtype=torch.float64) for _ in range(p)] if r == root else None
            with rules.recording() as rec:
                dt.gather(x, a, dst=root, algorithm=algorithm)
            b = [_inputs(p, i, n) for i in range(p)] if r == root else None
            return (a, b, rec) if r == root else ([], [], rec)
        a = torch.empty(n, dtype=torch.float64)
        src = [_inputs(p, root, n) + j for j in range(p)] if r == root else None
        with rules.recording() as rec:
            dt.scatter(a, src, src=root, algorithm=algorithm)
        return [a], [_inputs(p, root, n) + r], rec
    if collective == "barrier":
        with rules.recording() as rec:
            dt.barrier(algorithm=algorithm)
        return [], [], rec
    raise KeyError(collective)


def _every_algorithm_worker() -> dict:
    out = {}
    for collective in sorted(ALGORITHMS):
        for algorithm in sorted(ALGORITHMS[collective]):
            if is_alias(collective, algorithm):
                continue
            for n in (SIZES if collective != "barrier" else (0,)):
                mine, ref, rec = _case(collective, algorithm, n)
                wrong = [i for i, (m, e) in enumerate(zip(mine, ref)) if not torch.equal(m, e)]
                out[(collective, algorithm, n)] = (wrong, rec.take())
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_every_algorithm_is_correct_and_deadlock_free_under_nccl_rules(run, world):
    results = run(world, _every_algorithm_worker, timeout=200)
    failures = []
    for key in results[0]:
        for r, res in enumerate(results):
            if res[key][0]:
                failures.append(f"{key}: rank {r} differs from torch in outputs {res[key][0]}")
        problems = rules.simulate([res[key][1] for res in results])
        failures += [f"{key}: {p}" for p in problems]
    assert not failures, "\n".join(failures[:20])
