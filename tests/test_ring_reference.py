"""The reference ring (one exchange per step) and the pipelined engine compute the same bits.

`reference_ring_all_reduce` is the loop a reader starts from (dt/collectives/ring.py);
`ring_all_reduce` runs the same schedule through dt.collectives.ring_engine, posting
ahead and forwarding segment by segment. Held equal bit for bit here (float sums in
the same order give the same rounding), and both equal to torch's, on both wires,
at worlds 2 to 5, for lengths that leave chunks empty, uneven and segmented.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dt.collectives import reference_ring_all_reduce, ring_all_reduce
from dt.collectives.ring_engine import RingSchedule
from dt.transport import connect, resolve_group, set_transport, shared_group
from tests.shm_checks import no_leaked_segments  # noqa: F401  (module fixture)
from tests.test_collectives import data


def _compare(wire: str) -> list[str]:
    set_transport(wire)
    try:  # the wire is chosen when the group connects: now, under this setting
        group = resolve_group(shared_group(list(range(dist.get_world_size())), f"ring-reference-{wire}"))
        connect(group)
    finally:
        set_transport(None)
    r, bad, case = dist.get_rank(), [], 0
    if (group.links.board is not None) != (wire == "shm"):
        return [f"the group is not on the {wire} wire"]
    for dtype, op in ((torch.float32, "SUM"), (torch.float32, "AVG"), (torch.float64, "MAX"),
                      (torch.int64, "PRODUCT"), (torch.bfloat16, "SUM")):
        for n in (0, 1, 3, 1000, 4099):
            case += 1
            x = data(case, r, n, dtype, op)
            if dtype in (torch.float32, torch.float64) and op != "MAX":  # fractions: rounding shows order
                x = x / 3
            ref, a, b = x.clone(), x.clone(), x.clone()
            dist.all_reduce(ref, op=getattr(dist.ReduceOp, op), group=group.pg)
            reference_ring_all_reduce(a, op, group)
            # 64-byte segments: the engine's chunks go in several pieces
            ring_all_reduce(b, op, group, segment_bytes=64)
            if not torch.equal(a, b):
                bad.append(f"{wire} {dtype} {op} n={n}: reference and engine differ")
            if not torch.allclose(a.double(), ref.double(), rtol=1e-2, atol=1e-2):
                bad.append(f"{wire} {dtype} {op} n={n}: reference differs from torch")
    return bad


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", (2, 3, 4, 5))
@pytest.mark.parametrize("wire", ("shm", "torch"))
def test_reference_ring_equals_engine(run, world, wire):
    for failures in run(world, _compare, wire, timeout=240):
        assert failures == [], failures[:10]


@pytest.mark.parametrize("p", (2, 3, 5, 8))
def test_schedule_moves_every_chunk_once_per_lap(p):
    """In the reducing lap a rank receives every chunk but the one it sends first, ending on its
    own (reduce-scatter), and what it receives at step s its right neighbour receives at s+1."""
    for r in range(p):
        s = RingSchedule(p, r, first=-1, laps=2, reduce=True)
        lap = [s.received(step) for step in range(p - 1)]
        assert sorted(lap) == sorted(set(range(p)) - {(r - 1) % p}) and lap[-1] == r
        right = RingSchedule(p, (r + 1) % p, first=-1, laps=2, reduce=True)
        assert all(right.received(step + 1) == s.received(step) for step in range(s.steps - 1))
        assert s.steps == 2 * (p - 1) and s.reducing == p - 1 and s.finishes(p - 2)
