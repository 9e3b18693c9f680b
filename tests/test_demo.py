"""`dt demo primitives`: every collective it shows holds what torch's would, at uneven worlds.

4 elements over 3, 5 or 8 ranks split unevenly (8 ranks: some pieces are
empty), the case that sized all_to_all's receive buffers wrongly. Each rank
runs the demo's function, then torch's own collectives (gloo) on the same
inputs; where gloo has no uneven list form, torch's all_to_all_single with
splits does the same movement.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dt import transport
from dt.layout import split_sizes
from dt.tools import cli, demo

PAYLOAD = 4096


def _torch_all_to_all(send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> list[list[float]]:
    out = torch.empty(sum(recv_sizes))
    dist.all_to_all_single(out, send, recv_sizes, send_sizes)
    return [t.tolist() for t in out.split(recv_sizes)]


def _torch_results() -> dict:
    """What torch's collectives give on the demo's inputs: {collective: (before, after)}."""
    r, p, root = dist.get_rank(), dist.get_world_size(), demo.ROOT
    sizes = split_sizes(demo.ELEMENTS, p)
    start = demo.start_of(r)
    split = [t.tolist() for t in start.split(sizes)]
    want = {}
    x = start.clone()
    dist.broadcast(x, src=root)
    want["broadcast"] = ([start.tolist()], [x.tolist()])
    x = start.clone()
    dist.reduce(x, dst=root)
    want["reduce"] = ([start.tolist()], [x.tolist()] if r == root else None)
    total = start.clone()
    dist.all_reduce(total)
    want["all_reduce"] = ([start.tolist()], [total.tolist()])
    shard = torch.empty(sizes[r])
    dist.reduce_scatter(shard, [t.clone() for t in start.split(sizes)])
    want["reduce_scatter"] = (split, [shard.tolist()])
    everyone = [torch.empty(demo.ELEMENTS) for _ in range(p)]
    dist.all_gather(everyone, start)
    want["all_gather"] = ([start.tolist()], [t.tolist() for t in everyone])
    # all_gather of uneven shards: every rank sends its shard to every rank.
    shards = _torch_all_to_all(shard.repeat(p), [sizes[r]] * p, sizes)
    want["reduce_scatter + all_gather"] = ([shard.tolist()], shards)
    gathered = [torch.empty(demo.ELEMENTS) for _ in range(p)] if r == root else None
    dist.gather(start, gathered, dst=root)
    want["gather"] = ([start.tolist()], [t.tolist() for t in gathered] if r == root else None)
    # scatter of uneven pieces: only the root sends, piece j to rank j.
    piece = _torch_all_to_all(start if r == root else torch.empty(0), sizes if r == root else [0] * p,
                              [sizes[r] if j == root else 0 for j in range(p)])[root]
    want["scatter"] = (split if r == root else None, [piece])
    want["all_to_all"] = (split, _torch_all_to_all(start, sizes, [sizes[r]] * p))
    return want


def _demo_and_torch(payload: int) -> tuple[dict, dict, bool, bool]:
    validating = transport.validation_enabled()
    got = demo.primitives(payload)
    return got, _torch_results(), validating, transport.validation_enabled()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [3, 5, 8])
def test_the_demo_at_uneven_worlds_matches_torch(run, world):
    results = run(world, _demo_and_torch, PAYLOAD, timeout=240)
    for rank, (got, want, validating, after) in enumerate(results):
        assert validating == after, "the demo must leave the worker's validation setting as it found it"
        assert set(want) == set(demo.COLLECTIVES)
        for name, (before, after_) in want.items():
            assert got[name]["before"] == before, (world, rank, name)
            assert got[name]["after"] == after_, (world, rank, name, got[name]["after"], after_)
    lines, ok = demo.render([got for got, *_ in results], PAYLOAD)
    assert ok
    text = "\n".join(lines)
    for title in demo.COLLECTIVES.values():
        assert title in text
    assert "'[" not in text and '"[' not in text  # numbers, not quoted strings
    assert "reduce_scatter + all_gather == all_reduce on every rank: yes" in text
    assert "measured == model: yes" in text
    formula = 2 * (world - 1) / world * PAYLOAD  # one function formats the header and the rows
    assert f"(model: 2(p-1)/p * S = {demo.byte_count(formula)}: the ranks' mean" in text
    assert lines[-2].split() == ["mean", demo.byte_count(formula), demo.byte_count(formula)]


def test_render_says_no_when_a_check_fails(run):
    results = [got for got, *_ in run(3, _demo_and_torch, PAYLOAD, timeout=240)]
    results[1]["ring_bytes_sent"] += 4
    lines, ok = demo.render(results, PAYLOAD)
    assert not ok and "  measured == model: NO" in lines


@pytest.mark.timeout(180)
def test_dt_demo_primitives_at_world_3(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # through dt's entry point, in this process: no second import of torch
    code = cli.main(["demo", "primitives", "--world", "3", "--bytes", "4096"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    assert "all_to_all: rank i sends its piece j" in out.out
    assert "     1  [10, 11 | 12 | 13]  [2 | 12 | 22]" in out.out
