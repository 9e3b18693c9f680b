"""The "dt" backend keeps torch.distributed's conventions, where torch code relies on them.

- A timeout reads as torch's does and is the exception torch raises for one:
  torch's own distributed suite (test_barrier_timeout_*) matches the message
  against " (Timed out|closed|timeout) " and catches a DistBackendError.
- `Work.wait(timeout=...)` raises when the work is not done in time, and the
  work goes on, as on gloo.
- A dt group serves the CPU as a torch group does (`_device_types`,
  `_get_pg_default_device`, `_get_backend(cpu)`), which is how a full state
  dict broadcast from rank 0 (Lightning's resume of a full checkpoint) finds
  its device: it gives what gloo gives.
- dt.traffic() files no setup message of a group's first collective under
  "send_recv" (the user's own point-to-point).
"""

from __future__ import annotations

import datetime
import re
import warnings

import pytest
import torch
import torch.distributed as dist

import dt
from dt.launcher import run_workers

TORCH_TIMEOUT = re.compile(" (Timed out|closed|timeout) ")  # torch's distributed_test.py


def _barrier_alone(connected: bool) -> tuple[str, str, bool, bool] | None:
    """Rank 0 alone calls a 1 s barrier on a dt group, as torch's _test_barrier_timeout does.

    connected: the group ran a collective first (the wait is then inside the barrier);
    else the barrier is the group's first collective, and the wait is in its setup.
    The 1 s is the barrier's own timeout= (torch's test_barrier_timeout_arg): a group
    made with 1 s could time out its gloo wire's connection on a loaded machine.
    """
    group = dist.new_group(backend="dt", timeout=datetime.timedelta(seconds=60))
    if connected:
        dist.barrier(group=group)
    if dist.get_rank() != 0:
        return None
    try:
        dist.barrier(group=group, timeout=datetime.timedelta(seconds=1))
    except Exception as exc:  # noqa: BLE001 - what it is, is the test
        return (type(exc).__name__, str(exc), isinstance(exc, dist.DistBackendError),
                isinstance(exc, dt.CollectiveTimeout))
    return ("ok", "", False, False)


@pytest.mark.parametrize("world", (2, 3))
@pytest.mark.parametrize("connected", (True, False), ids=("in the barrier", "in the setup"))
def test_a_timeout_reads_and_is_caught_as_torchs(run, world, connected):
    kind, message, is_torchs, is_dts = run(world, _barrier_alone, connected, timeout=60)[0]
    assert kind == "CollectiveTimeout" and is_torchs and is_dts, (kind, message)
    assert TORCH_TIMEOUT.search(message), message
    assert "Timed out waiting 1000ms" in message  # gloo's words for the group's 1 s
    assert message.startswith("rank 0 ")  # dt's own: who waited, on whom, where
    assert re.search(r"rank [12]\b", message), message
    if connected:
        # (its validation, or it): at a step of a message, or a sync of the shared-memory board
        assert "barrier" in message and ("at step " in message or "at sync " in message), message
    else:
        assert "first collective" in message, message


def _wait_with_timeout(backend: str) -> tuple[list, str, bool, bool, list]:
    """rank 0's async all-reduce, waited 0.1 s while rank 1 has not joined, then fully."""
    group = dist.new_group(backend=backend)
    signal = dist.new_group(backend="gloo")
    r = dist.get_rank()
    x = torch.arange(4.0) + r
    first = dist.all_reduce(x, group=group, async_op=True)
    waited = first.wait(timeout=datetime.timedelta(seconds=60))
    y = torch.ones(3) * (r + 1)
    kind, completed = "", True
    if r == 0:
        late = dist.all_reduce(y, group=group, async_op=True)
        try:
            late.wait(timeout=datetime.timedelta(milliseconds=100))
            kind = "returned"
        except RuntimeError as exc:
            kind = "CollectiveTimeout" if isinstance(exc, dt.CollectiveTimeout) else type(exc).__name__
        completed = late.is_completed()
        dist.send(torch.ones(1), 1, group=signal)  # only now may rank 1 join
        late.wait(timeout=datetime.timedelta(seconds=60))  # the work went on
    else:
        dist.recv(torch.empty(1), 0, group=signal)
        dist.all_reduce(y, group=group)
    return [waited, *x.tolist()], kind, completed, first.is_completed(), y.tolist()


def test_work_wait_timeout_behaves_as_gloos(run):
    gloo, on_dt = run(2, _wait_with_timeout, "gloo"), run(2, _wait_with_timeout, "dt")
    # rank 0: the finite wait raised (gloo: RuntimeError; dt: its CollectiveTimeout, a
    # RuntimeError), the work was not completed then, and completed later with the sum.
    assert gloo[0][1] == "RuntimeError" and on_dt[0][1] == "CollectiveTimeout"
    for ranks in (gloo, on_dt):
        assert ranks[0][2] is False
        for waited_and_x, _, _, first_done, y in ranks:
            assert waited_and_x == [True, 1.0, 3.0, 5.0, 7.0] and first_done and y == [3.0] * 3
    assert [r[4] for r in gloo] == [r[4] for r in on_dt]


def _devices() -> list:
    out = []
    for backend in ("gloo", "dt"):
        group = dist.new_group(backend=backend)
        with warnings.catch_warnings():  # torch says _get_pg_default_device will be deprecated
            warnings.filterwarnings("ignore", "`_get_pg_default_device` will be deprecated")
            warnings.filterwarnings("ignore", "Multiple backends are registered")  # gloo: cpu, cuda
            default = dist.distributed_c10d._get_pg_default_device(group)
        backend_obj = group._get_backend(torch.device("cpu"))
        out.append((group._device_types, default, dist.get_backend(group),
                    isinstance(backend_obj, dist.ProcessGroupGloo)))
    with dt.traffic() as t:  # the group's own method (torch's dist.monitored_barrier wants gloo)
        group.monitored_barrier(datetime.timedelta(seconds=60))
    return [*out, t.by_collective["monitored_barrier"].calls]


def test_a_dt_group_serves_the_cpu_as_a_gloo_group_does(run):
    for gloo, on_dt, monitored_calls in run(2, _devices):
        assert monitored_calls == 1  # dt's, not the wire's: the device backend is no way around dt
        assert torch.device("cpu") in gloo[0] and on_dt[0] == [torch.device("cpu")]  # gloo: cuda too
        assert gloo[1] == on_dt[1] == torch.device("cpu")
        assert on_dt[2] == "dt" and on_dt[3]  # its CPU backend: the gloo wire it sends through


def _resume_full_checkpoint() -> torch.Tensor:
    """Lightning's ModelParallelStrategy resuming a full checkpoint: FSDP2 shards, rank 0 holds
    the full state dict, set_model_state_dict(broadcast_from_rank0=True) hands it out."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def model(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))

    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    sharded = model(seed=100 + dist.get_rank())  # every rank starts from other weights
    for layer in sharded:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    full = model(seed=0).state_dict() if dist.get_rank() == 0 else {}
    set_model_state_dict(sharded, full, options=StateDictOptions(full_state_dict=True,
                                                                 broadcast_from_rank0=True))
    return torch.cat([q.full_tensor().detach().flatten() for q in sharded.parameters()])


def test_full_state_dict_broadcast_from_rank0_as_on_gloo(run):
    torch.manual_seed(0)
    want = torch.cat([q.detach().flatten() for q in torch.nn.Sequential(
        torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3)).parameters()])
    gloo = run(2, _resume_full_checkpoint)
    on_dt = run_workers(_resume_full_checkpoint, 2, backend="dt", timeout=120)
    for got in (*gloo, *on_dt):
        assert torch.equal(got, want)


def _first_collectives_traffic() -> tuple[dict, dict, int]:
    group = dist.new_group(backend="dt")
    counts = []
    for _ in range(2):  # the first connects the group; the second has nothing to set up
        with dt.traffic() as t:
            dist.all_reduce(torch.ones(1000), group=group)
        counts.append({k: v.as_dict() for k, v in t.by_collective.items()})
    with dt.traffic() as t:  # the user's own point-to-point is counted, as before
        p = dist.get_world_size()
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, torch.ones(5), (dist.get_rank() + 1) % p, group),
            dist.P2POp(dist.irecv, torch.empty(5), (dist.get_rank() - 1) % p, group)])
        # Waited, as torch asks: works left unwaited on a dt group leave its gloo wire's
        # socket loop spinning a core for the life of the process (a known gap, not this test's).
        for w in works:
            w.wait()
        dist.barrier(group=group)
    return counts[0], counts[1], t.by_collective["send_recv"].bytes_sent


@pytest.mark.parametrize("world", (2, 3))
def test_setup_is_not_the_users_point_to_point(run, world):
    for first, second, p2p_bytes in run(world, _first_collectives_traffic):
        assert "send_recv" not in first, first
        assert first == second  # the first collective costs what any other does
        assert p2p_bytes == 5 * 4
