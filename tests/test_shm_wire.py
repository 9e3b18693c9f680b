"""The shared-memory wire: topology, mixed groups, point-to-point channels, traffic per wire, failures.

Hosts are simulated by marking ranks with DT_HOST before a new group's
first collective (the world group of the pool is already connected as one
host). Channels are made small (DT_SHM_CHANNEL_BYTES) so that messages
span many slots and the progress engine, not luck, moves them.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

import dt
from dt import cost, transport
from dt.collectives import auto
from dt.collectives.registry import names
from dt.launcher import WorkerError
from dt.transport.shm import segment
from tests.shm_checks import no_leaked_segments  # noqa: F401  (module fixture)
from tests.test_collectives import data


def _group_marked(hosts: list[int], **env: str):
    """A fresh group of every rank, connected with this rank marked as host hosts[rank]."""
    r, p = dist.get_rank(), dist.get_world_size()
    saved = {k: os.environ.get(k) for k in ("DT_HOST", *env)}
    os.environ["DT_HOST"] = f"host{hosts[r]}"
    os.environ.update(env)
    try:
        g = dist.new_group(list(range(p)))
        dt.barrier(group=g, algorithm="dissemination")  # connects it
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return g


def _mixed(hosts: list[int]) -> dict:
    r, p = dist.get_rank(), dist.get_world_size()
    dt.set_validation(False)
    g = _group_marked(hosts, DT_SHM_CHANNEL_BYTES="1")  # 64 KiB slots: messages span many
    view = transport.resolve_group(g)
    out: dict = {"hosts": list(transport.topology_of(view).hosts),
                 "wires": [view.wire_for(q).name for q in range(p)], "bad": []}
    n = 300_000 + r % 2  # 1.2 MB: many slots on the shm side
    for algo in [a for a in names("all_reduce", loadstore=False) if a != "hierarchical"] + ["auto"]:
        x = data(3, r, 300_001, torch.float32)
        ref = x.clone()
        dist.all_reduce(ref, group=g)
        with dt.traffic() as t:
            dt.all_reduce(x, group=g, algorithm=algo)
        if not torch.equal(x, ref):
            out["bad"].append(f"all_reduce {algo}")
        if algo == "ring":
            model = cost.ring_all_reduce(300_001, 4, p, r, 4 << 20 >> 2)
            right_same = out["wires"][(r + 1) % p] == "shm"
            out["ring_shm_sent"] = t.by_wire["shm"].bytes_sent
            out["ring_model_shm_sent"] = model.bytes_sent if right_same else 0
            out["ring_total"] = (t.bytes_sent, model.bytes_sent)
        out.setdefault("picked", []).append(auto.choose("all_reduce", "auto", 4 * n, view))
    for a in [a for a in names("all_gather", loadstore=False) if a != "hierarchical"]:
        x = data(4, r, 50_000, torch.int64)
        o, ref = torch.empty(50_000 * p, dtype=torch.int64), torch.empty(50_000 * p, dtype=torch.int64)
        dist.all_gather_into_tensor(ref, x, group=g)
        dt.all_gather_into_tensor(o, x, group=g, algorithm=a)
        if not torch.equal(o, ref):
            out["bad"].append(f"all_gather {a}")
    ins = [data(5 + j, r, 40_000 + j, torch.float32) for j in range(p)]
    outs = [torch.empty(40_000 + r) for _ in range(p)]
    dt.all_to_all(outs, ins, group=g)
    if not all(torch.equal(outs[j], data(5 + r, j, 40_000 + r, torch.float32)) for j in range(p)):
        out["bad"].append("all_to_all")
    try:
        dt.all_reduce(torch.ones(3), group=g, algorithm="two_shot")
        out["two_shot_error"] = None
    except dt.CollectiveError as exc:
        out["two_shot_error"] = str(exc)
    out["shm_empty_shared"] = transport.is_shared(dt.shm_empty(10, group=g), g)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hosts", [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1]])
def test_mixed_group_shares_memory_only_within_a_host(run, hosts):
    for r, res in enumerate(run(4, _mixed, hosts, timeout=100)):
        assert res["bad"] == []
        assert res["hosts"] == hosts
        shared = hosts.count(hosts[r]) > 1  # a rank alone on its host has no segment
        assert res["wires"] == ["shm" if shared and hosts[q] == hosts[r] else "torch" for q in range(4)]
        # bytes on the shared-memory wire are exactly the ring's sends to a same-host neighbour
        assert res["ring_shm_sent"] == res["ring_model_shm_sent"]
        assert res["ring_total"][0] == res["ring_total"][1]
        assert "one_shot" not in res["picked"] and "two_shot" not in res["picked"]
        assert "needs every rank of the group" in res["two_shot_error"] and "hosts" in res["two_shot_error"]
        assert res["shm_empty_shared"] is False


def _torch_only() -> dict:
    transport.set_transport("torch")
    try:
        g = dist.new_group(list(range(dist.get_world_size())))
        x = torch.ones(1000)
        with dt.traffic() as t:
            dt.all_reduce(x, group=g)
        view = transport.resolve_group(g)
        try:
            dt.all_reduce(x, group=g, algorithm="one_shot")
            err = None
        except dt.CollectiveError as exc:
            err = str(exc)
        return {"wires": sorted(t.by_wire), "sum": x[0].item(), "board": view.links.board is None,
                "err": err}
    finally:
        transport.set_transport("auto")


def test_transport_torch_turns_the_wire_off(run):
    for res in run(3, _torch_only):
        assert res["wires"] == ["torch"] and res["sum"] == 3.0 and res["board"]
        assert "DT_TRANSPORT=torch" in res["err"] and "off" in res["err"]


# ---------------------------------------------------------------------------
# Traffic on the shm wire equals dt.cost, byte for byte
# ---------------------------------------------------------------------------


def _loadstore_traffic() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    dt.set_validation(False)
    g = transport.resolve_group(None)
    transport.connect(g)
    stage = g.links.board.capacity
    bad = []

    def check(label, t, collective, algorithm, numels, isz, **kw):
        m = cost.traffic_for(collective, algorithm, numels, isz, p, r, stage_bytes=stage, **kw)
        got = t.by_wire["shm"]
        mine = (got.bytes_sent, got.bytes_received, got.messages_sent, got.messages_received)
        want = (m.bytes_sent, m.bytes_received, m.messages_sent, m.messages_received)
        if mine != want or t.bytes_sent != got.bytes_sent:
            bad.append(f"{label}: measured {mine} model {want}")

    for n in (0, 1, 3, 1000, 4099):
        for algo in names("all_reduce", loadstore=True):
            with dt.traffic() as t:
                dt.all_reduce(torch.ones(n), algorithm=algo)
            check(f"all_reduce {algo} n={n}", t, "all_reduce", algo, n, 4)
        with dt.traffic() as t:
            dt.reduce(torch.ones(n), dst=p - 1, algorithm="one_shot")
        check(f"reduce n={n}", t, "reduce", "one_shot", n, 4, root=p - 1)
        with dt.traffic() as t:
            dt.broadcast(torch.ones(n, dtype=torch.float64), src=0, algorithm="one_shot")
        check(f"broadcast n={n}", t, "broadcast", "one_shot", n, 8, root=0)
        blocks = [(n + 3 * i) % 11 for i in range(p)]
        with dt.traffic() as t:
            dt.all_gather([torch.empty(b) for b in blocks], torch.ones(blocks[r]), algorithm="one_shot")
        check(f"all_gather n={n}", t, "all_gather", "one_shot", blocks, 4)
        with dt.traffic() as t:
            dt.reduce_scatter(torch.empty(blocks[r]), [torch.ones(b) for b in blocks], algorithm="one_shot")
        check(f"reduce_scatter n={n}", t, "reduce_scatter", "one_shot", blocks, 4)
        send = [(n + 5 * r + j) % 7 for j in range(p)]
        recv = [(n + 5 * j + r) % 7 for j in range(p)]
        with dt.traffic() as t:
            dt.all_to_all([torch.empty(k) for k in recv], [torch.ones(k) for k in send], algorithm="one_shot")
        check(f"all_to_all n={n}", t, "all_to_all", "one_shot", send, 4, recv_numels=recv)
        with dt.traffic() as t:
            got = [torch.empty(b) for b in blocks] if r == 0 else None
            dt.gather(torch.ones(blocks[r]), got, dst=0, algorithm="one_shot")
        check(f"gather n={n}", t, "gather", "one_shot", blocks, 4, root=0)
        with dt.traffic() as t:
            src = [torch.ones(b) for b in blocks] if r == p - 1 else None
            dt.scatter(torch.empty(blocks[r]), src, src=p - 1, algorithm="one_shot")
        check(f"scatter n={n}", t, "scatter", "one_shot", blocks, 4, root=p - 1)
        with dt.traffic() as t:  # point-to-point algorithms ride the shm wire too
            dt.all_reduce(torch.ones(n), algorithm="ring")
        check(f"ring over shm n={n}", t, "all_reduce", "ring", n, 4, segment_elems=(4 << 20) // 4)
    return bad


@pytest.mark.parametrize("world", (2, 3, 5))
def test_traffic_per_wire_equals_cost_model(run, world):
    for bad in run(world, _loadstore_traffic):
        assert bad == []


# ---------------------------------------------------------------------------
# Point-to-point channels
# ---------------------------------------------------------------------------


def _channels() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    dt.set_validation(False)
    g = _group_marked([0] * p, DT_SHM_CHANNEL_BYTES="1")  # 4 slots of 64 KiB per channel
    peer = 1 - r
    bad = []
    big = torch.arange(600_000, dtype=torch.float64) + r  # 4.8 MB: ~73 slots
    got = torch.empty(600_000, dtype=torch.float64)
    # Both ranks post the big send first and wait on the receive: only the engine avoids deadlock.
    sends = [transport.isend(big, peer, group=g)]
    small_in = [torch.empty(3) for _ in range(20)]
    recvs = [transport.irecv(got, peer, group=g)] + [transport.irecv(t, peer, group=g) for t in small_in]
    sends += [transport.isend(torch.full((3,), float(i + 10 * r)), peer, group=g) for i in range(20)]
    for h in reversed(recvs):
        h.wait()
    for h in sends:
        h.wait()
    if not torch.equal(got, torch.arange(600_000, dtype=torch.float64) + peer):
        bad.append("big message")
    if [t[0].item() for t in small_in] != [float(i + 10 * peer) for i in range(20)]:
        bad.append("20 small messages posted ahead of their sends")
    empty = torch.empty(0)
    h = transport.isend(torch.empty(0), peer, group=g)
    transport.recv(empty, peer, group=g)
    h.wait()
    strided = torch.arange(40.0).view(8, 5)[:, 1] + r  # not contiguous, both ways
    into = torch.zeros(8, 5)[:, 2]
    h = transport.isend(strided, peer, group=g)
    transport.recv(into, peer, group=g)
    h.wait()
    if not torch.equal(into, torch.arange(40.0).view(8, 5)[:, 1] + peer):
        bad.append("strided send and receive")
    return bad


def test_channels_move_big_small_empty_and_strided_messages_posted_ahead(run):
    for bad in run(2, _channels):
        assert bad == []


def _rings_on_take() -> dict:
    """Rank 1 takes two messages of rank 0's: a token (one slot of four) and, once it has
    filled the channel, a message of ten slots. Rank 1 counts the bells its takes ring."""
    r = dist.get_rank()
    dt.set_validation(False)
    g = _group_marked([0, 0], DT_SHM_CHANNEL_BYTES="1")  # 4 slots of 64 KiB per channel
    engine = transport.resolve_group(g).links.host.engine
    big = torch.arange(160_000, dtype=torch.float32)  # 640 KB: ten slots
    if r == 0:
        transport.send(torch.ones(1), 1, group=g)  # fits: done at once
        transport.recv(torch.empty(1), 1, group=g)
        transport.send(big, 1, group=g)  # waits for slots after the first four
        return {}
    rang = []
    ring = type(engine.sync).ring

    def taken(tensor: torch.Tensor, sent: int) -> int:
        ch, deadline = engine.inn[0], time.monotonic() + 60
        while engine.words[ch.sent_i] - ch.mine < sent:  # rank 0 has sent this many slots
            assert time.monotonic() < deadline, f"rank 0 never sent {sent} slots"
            time.sleep(0.001)
        rang.clear()
        type(engine.sync).ring = lambda self, rank: (rang.append(rank), ring(self, rank))
        try:
            transport.recv(tensor, 0, group=g)
        finally:
            type(engine.sync).ring = ring
        return len(rang)

    token = taken(torch.empty(1), 1)
    transport.send(torch.ones(1), 0, group=g)
    got = torch.empty_like(big)
    full = taken(got, engine.inn[0].k)
    return {"token": token, "full": full > 0, "big": torch.equal(got, big)}


@pytest.mark.timeout(120)
def test_a_take_rings_only_a_sender_that_waits_for_slots(run):
    """A sender needs a bell when slots free up only if it found the channel full; the
    token of a barrier it sent would otherwise wake it from its next wait for nothing."""
    assert run(2, _rings_on_take, timeout=100)[1] == {"token": 0, "full": True, "big": True}


def _size_mismatch():
    dt.set_validation(False)
    dt.barrier()
    r = dist.get_rank()
    if r == 0:
        transport.send(torch.ones(5), 1)
    else:
        transport.recv(torch.empty(7), 0)


def test_size_mismatch_names_both_sizes(run):
    with pytest.raises(WorkerError) as info:
        run(2, _size_mismatch, timeout=30)
    err = info.value.errors[1]
    assert err.kind == "CollectiveError"
    assert "rank 0 sent a message of 20 bytes where this receive expects 28" in err.message


# ---------------------------------------------------------------------------
# Failures: a peer that dies, a peer that never comes, segments that would leak
# ---------------------------------------------------------------------------


def _warm():
    dt.barrier()


def _killed_mid_collective(algorithm: str) -> None:
    """Rank 2 dies inside its all-reduce (after its first sync, or its second batch of
    messages): its peers are mid-collective, waiting on it (its next sync, its messages)."""
    from dt.transport.comm import Comm
    from dt.transport.shm.board import BoardCall

    dt.set_validation(False)
    dt.barrier()
    if dist.get_rank() == 2:
        cls, name = (BoardCall, "sync") if algorithm == "two_shot" else (Comm, "batch")
        real, calls, last = getattr(cls, name), [], 1 if algorithm == "two_shot" else 2

        def then_die(self, *args):
            out = real(self, *args)
            calls.append(1)
            if len(calls) == last:
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        setattr(cls, name, then_die)
    dt.all_reduce(torch.ones(100_000), algorithm=algorithm)


@pytest.mark.parametrize("algorithm", ["two_shot", "ring"])
def test_peer_killed_mid_collective_is_named_without_a_hang(run, algorithm):
    run(3, _warm)  # module imported, group connected
    t0 = time.perf_counter()
    with pytest.raises(WorkerError) as info:
        run(3, _killed_mid_collective, algorithm, timeout=60)  # dt timeout 48 s: death must beat it
    assert time.perf_counter() - t0 < 30  # named at once, not at the 48 s timeout
    errors = info.value.errors
    assert errors[2].kind == "died"
    for r in (0, 1):  # each names the dead rank, or the peer that gave up because of it
        assert errors[r].kind == "CollectiveError", errors[r].message
        assert "died" in errors[r].message or "gave up" in errors[r].message
    assert any(("rank 2 died" in errors[r].message or "rank 2 (pid" in errors[r].message)
               for r in (0, 1))


def _two_shot_skipped():
    dt.set_validation(False)
    dt.barrier()
    if dist.get_rank() == 0:
        dt.all_reduce(torch.ones(10), algorithm="two_shot")


def test_skipped_call_times_out_at_its_sync(run):
    run(2, _warm)
    with pytest.raises(WorkerError) as info:
        run(2, _two_shot_skipped, timeout=4)
    err = info.value.errors[0]
    assert err.kind == "CollectiveTimeout"
    assert "all_reduce[two_shot] at sync 1" in err.message and "on rank 1 " in err.message


def test_sweep_unlinks_segments_of_dead_creators():
    dead = 1
    while segment.alive(dead) or dead == os.getpid():
        dead += 7919
    stale = os.path.join(segment.DIR, segment.segment_name(dead, "abc", "test-stale"))
    live = os.path.join(segment.DIR, segment.segment_name(os.getpid(), "abc", "test-live"))
    for path in (stale, live):
        with open(path, "wb") as f:
            f.write(b"x")
    try:
        gone = segment.sweep()
        assert os.path.basename(stale) in gone and not os.path.exists(stale)
        assert os.path.exists(live)
    finally:
        for path in (stale, live):
            if os.path.exists(path):
                os.unlink(path)
