"""Measured traffic equals the cost model's arithmetic, exactly, on every rank.

The transport counts every byte and message a rank posts; dt.cost says
what each algorithm should send. Validation is turned off so the counts are
the algorithm's alone (its own traffic is checked separately).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dt
from dt import cost
from dt.layout import split_sizes
from dt.transport import set_validation


def _counts(t) -> tuple[int, int, int, int]:
    return (t.bytes_sent, t.bytes_received, t.messages_sent, t.messages_received)


def _model(m: cost.Traffic) -> tuple[int, int, int, int]:
    return (m.bytes_sent, m.bytes_received, m.messages_sent, m.messages_received)


def _measure_everything(sizes: list[int]) -> list[str]:
    set_validation(False)
    r, p = dist.get_rank(), dist.get_world_size()
    failures = []

    def check(label, traffic, model):
        if _counts(traffic) != _model(model):
            failures.append(f"{label}: measured {_counts(traffic)} model {_model(model)}")

    seg = 4096  # small segments so multi-segment message counts are exercised too
    for n in sizes:
        with dt.traffic() as t:
            dt.ring_all_reduce(torch.ones(n), segment_bytes=seg)
        check(f"ring all_reduce n={n}", t, cost.ring_all_reduce(n, 4, p, r, seg // 4))
        with dt.traffic() as t:
            dt.all_reduce(torch.ones(n, dtype=torch.float64), algorithm="naive")
        check(f"naive all_reduce n={n}", t, cost.naive_all_reduce(n, 8, p, r))
        chunks = split_sizes(n, p)
        with dt.traffic() as t:
            dt.ring_all_gather([torch.empty(c) for c in chunks], torch.ones(chunks[r]),
                               segment_bytes=seg)
        check(f"ring all_gather n={n}", t, cost.ring_all_gather(chunks, 4, r, seg // 4))
        with dt.traffic() as t:
            dt.ring_reduce_scatter(torch.empty(chunks[r]), [torch.ones(c) for c in chunks],
                                   segment_bytes=seg)
        check(f"ring reduce_scatter n={n}", t, cost.ring_reduce_scatter(chunks, 4, r, seg // 4))
        root = p - 1
        with dt.traffic() as t:
            dt.ring_broadcast(torch.ones(n), src=root, segment_bytes=seg)
        check(f"ring broadcast n={n}", t, cost.ring_broadcast(n, 4, p, r, root, seg // 4))
        with dt.traffic() as t:
            dt.broadcast(torch.ones(n), src=root, algorithm="flat")
        check(f"flat broadcast n={n}", t, cost.flat_broadcast(n, 4, p, r, root))
        with dt.traffic() as t:
            dt.reduce(torch.ones(n), dst=root, algorithm="flat")
        check(f"flat reduce n={n}", t, cost.flat_reduce(n, 4, p, r, root))
        blocks = [(n + i) % 7 for i in range(p)]
        with dt.traffic() as t:
            dt.all_to_all([torch.empty((n + r) % 7) for _ in range(p)],
                          [torch.ones(blocks[j]) for j in range(p)], algorithm="pairwise")
        check(f"pairwise all_to_all n={n}", t,
              cost.pairwise_all_to_all(blocks, [(n + r) % 7] * p, 4, r))
        with dt.traffic() as t:
            dt.all_gather_into_tensor(torch.empty(n * p), torch.ones(n), algorithm="bruck")
        check(f"bruck all_gather n={n}", t, cost.bruck_all_gather(n, 4, p))
    with dt.traffic() as t:
        dt.barrier(algorithm="dissemination")
    check("barrier", t, cost.dissemination_barrier(p))
    return failures


@pytest.mark.parametrize("world", (1, 2, 3, 5, 8))
def test_traffic_equals_cost_model(run, world):
    for failures in run(world, _measure_everything, [0, 1, 3, 33, 1000, 4099]):
        assert failures == []


def _busiest_rank_bytes(n: int) -> dict[str, int]:
    set_validation(False)
    out = {}
    for algo in ("ring", "naive"):
        with dt.traffic() as t:
            dt.all_reduce(torch.ones(n), algorithm=algo)
        out[algo] = t.bytes_sent
    return out


def test_ring_traffic_bounded_naive_linear(run):
    n = 12_000  # divisible by 2, 4 and 8: the even-chunk formulas apply exactly
    size = 4 * n
    for p in (2, 4, 8):
        per_rank = run(p, _busiest_rank_bytes, n)
        ring = max(r["ring"] for r in per_rank)
        naive = max(r["naive"] for r in per_rank)
        assert ring == 2 * (p - 1) * size // p  # 2(p-1)/p * S: never more than 2S
        assert ring < 2 * size
        assert naive == (p - 1) * size  # the root sends (p-1) * S
    # at p = 8 the naive root sends 3.5x what the busiest ring rank does
    assert naive / ring == pytest.approx(7 / (2 * 7 / 8))


def _validation_and_breakdown() -> dict:
    p = dist.get_world_size()
    set_validation(True)
    with dt.traffic() as t:
        dt.all_reduce(torch.ones(100), algorithm="ring")
        dt.broadcast(torch.ones(10), src=0, algorithm="flat")
    signature = 8 + 2 * p  # int64 fields of one validation signature
    return {
        "validate": t.by_collective["validate"].as_dict(),
        "all_reduce": t.by_collective["all_reduce"].as_dict(),
        "broadcast": t.by_collective["broadcast"].as_dict(),
        "algo": t.by_algorithm["all_reduce:ring"].as_dict(),
        "total_sent": t.bytes_sent,
        "model_validate": cost.bruck_all_gather(signature, 8, p).bytes_sent * 2,
        "model_ring": cost.ring_all_reduce(100, 4, p, dist.get_rank()).bytes_sent,
    }


def test_breakdown_separates_collectives_and_validation(run):
    for res in run(3, _validation_and_breakdown):
        assert res["all_reduce"]["calls"] == 1 and res["broadcast"]["calls"] == 1
        assert res["validate"]["calls"] == 2
        assert res["validate"]["bytes_sent"] == res["model_validate"]
        assert res["all_reduce"]["bytes_sent"] == res["model_ring"] == res["algo"]["bytes_sent"]
        assert res["total_sent"] == (res["validate"]["bytes_sent"] + res["all_reduce"]["bytes_sent"]
                                     + res["broadcast"]["bytes_sent"])


def _validation_on_both_wires() -> dict:
    """The signature exchange's bytes on each wire against its formula: Bruck's all-gather over
    messages (torch wire), a one-shot all-gather of the p rows through the board (shm)."""
    from dt.bench.harness import wire_group
    from dt.collectives.validate import exchange_algorithm
    from dt.cost.traffic import traffic_for
    from dt.transport import resolve_group

    p, me = dist.get_world_size(), dist.get_rank()
    set_validation(True)
    out = {}
    for wire in ("torch", "shm"):
        g = wire_group(wire)
        x = torch.ones(7)
        algo = exchange_algorithm(resolve_group(g), x.device)
        with dt.traffic() as t:
            dt.all_reduce(x, group=g)
        row = 8 + 2 * p  # int64 fields of one signature
        model = traffic_for("all_gather", algo, [row] * p, 8, p, me)
        got = t.by_collective["validate"]
        out[wire] = (algo, got.bytes_sent, got.bytes_received, model.bytes_sent, model.bytes_received)
    return out


def test_validation_exchange_is_the_wire_s_all_gather(run):
    for p in (2, 3):
        for res in run(p, _validation_on_both_wires):
            assert res["torch"][0] == "bruck" and res["shm"][0] == "one_shot"
            for algo, sent, received, model_sent, model_received in res.values():
                assert (sent, received) == (model_sent, model_received), (algo, res)
