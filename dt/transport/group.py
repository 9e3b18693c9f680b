"""A process group as seen from one rank: who is in it, in what order, on which device.

Peers are always named by their rank *in the group*; `Group` translates to
the global ranks torch.distributed wants. `Group.links` says which wire
reaches each peer: the torch wire until the group's first collective, then
whatever dt.transport.connect found (shared memory for the ranks of this
host, the torch wire for the others).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dt.transport.wire import TorchWire, Wire

if TYPE_CHECKING:  # the types only: these files import no Group, so no cycle
    from dt.transport.shm.board import Board
    from dt.transport.shm.host import HostLink
    from dt.transport.topology import Topology

__all__ = ["GROUPS", "Group", "Groups", "Links", "default_device", "resolve_group", "shared_group"]


@dataclass(eq=False)
class Links:
    """How one rank reaches each peer of a group; filled once by dt.transport.connect.

    The three fields typed Any are filled by layers above this file: their types
    cannot be named here (dt.collectives is above the transport; asynchronous.py
    imports this file).
    """

    topology: Topology | None = None  # which ranks share a host; None: not connected yet
    wires: list[Wire] | None = None  # the wire per group rank (None: the group's torch wire)
    torch: Wire | None = None  # the torch wire CPU traffic to other hosts takes (pumps the shm engine)
    host: HostLink | None = None  # this host's shared segment, engine and board (None without one)
    board: Board | None = None  # the host's board when the whole group is on it (load/store algorithms)
    why_not: str = ""  # why there is no board
    parts: dict[tuple[int, ...], Group] = field(default_factory=dict)  # sub-groups on these wires (parts.py)
    agreed: Any = None  # the figures auto prices with across hosts (dt.collectives.agreed.Agreed)
    comm: Any = None  # the group's communication thread once an async call made one (asynchronous.py)
    plans: dict[tuple, Any] = field(default_factory=dict)  # per call shape (dt.collectives.plan.CallPlan)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def close(self) -> None:
        """Forget the connection (dt.transport.reset): the next collective connects afresh.

        Dropping the host's segment, wires and plans here, not at the next garbage
        collection, is what unmaps the segment now (the board points back at its group).
        """
        with self.lock:
            if self.torch is not None:
                self.torch.close()  # across hosts: its pump thread
            fresh = Links()
            for f in fields(self):
                if f.name != "lock":
                    setattr(self, f.name, getattr(fresh, f.name))


@dataclass(frozen=True)
class Group:
    """A process group from this rank's point of view.

    `pg` is what torch.distributed calls the group (None for the default
    world group); `ranks` are its members' global ranks in group order.
    """

    pg: Any
    rank: int
    size: int
    ranks: tuple[int, ...]
    backend: str = "gloo"
    name: str = "0"  # torch's name for the group: the same on every rank
    wire: Wire = field(default_factory=Wire, compare=False, repr=False)
    links: Links = field(default_factory=Links, compare=False, repr=False)

    def wire_for(self, peer: int, device: str = "cpu") -> Wire:
        """The wire that carries this rank's traffic with group rank `peer`.

        Only CPU tensors take shared memory; others stay on torch.distributed
        (NCCL's own transports do that job between GPUs).
        """
        wires = self.links.wires
        if wires is None:
            return self.wire
        if device != "cpu":
            return self.wire
        return wires[peer]

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    def group_rank(self, global_rank: int) -> int:
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise ValueError(
                f"global rank {global_rank} is not a member of this group "
                f"(members: {list(self.ranks)})"
            ) from None

    @property
    def key(self) -> tuple[str, tuple[int, ...]]:
        """This group's identity on every rank: two groups with the same members differ by name."""
        return (self.name, self.ranks)

    def __deepcopy__(self, memo: dict) -> Group:
        # A handle on shared communicators: copying a module that holds one
        # (copy.deepcopy(model)) must share the group, not try to pickle it.
        return self


@dataclass
class Groups:
    """This process's views of its groups, and the process groups dt made for reuse.

    `reset()` (dt.transport.reset) disconnects and forgets every view: a run starts
    with its groups unconnected (its DT_HOST, DT_TRANSPORT may differ from the last
    run's). `made` stays: each gloo group keeps threads of its own (shared_group).
    """

    views: dict[int, Group] = field(default_factory=dict)  # id(process group) -> resolve_group's view
    # (ranks, purpose) -> (the world it was made in, the process group): shared_group's
    made: dict[tuple[tuple[int, ...], str], tuple[Any, Any]] = field(default_factory=dict)

    def reset(self) -> None:
        for view in self.views.values():
            view.links.close()
        self.views.clear()


GROUPS = Groups()


def resolve_group(group: Any = None) -> Group:
    """Translate `group` (None, a ProcessGroup, or a `Group`) for this rank.

    Raises ValueError, naming this rank and the group's members, when this
    rank is not in the group.
    """
    if isinstance(group, Group):
        return group
    if not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: call dt.launcher.init() or run "
            "under dt.launcher.run_workers / torchrun first"
        )
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            f"rank {dist.get_rank()} is not a member of the group it passed "
            "(dist.new_group returned NON_GROUP_MEMBER on this rank)"
        )
    cached = GROUPS.views.get(id(group))
    if cached is not None and cached.pg is group:
        return cached
    if group is None:
        ranks = tuple(range(dist.get_world_size()))
    else:
        try:
            ranks = tuple(dist.get_process_group_ranks(group))
        except KeyError:
            raise ValueError(
                f"rank {dist.get_rank()} was given a process group torch no longer knows: destroyed, or "
                "made by a past run in this process (dt's launcher destroys those before each run; "
                "make it in this run, or keep one with dt.transport.shared_group)"
            ) from None
    me = dist.get_rank()
    if me not in ranks:
        raise ValueError(f"rank {me} is not a member of the group {list(ranks)}")
    backend = dist.get_backend(group)
    name = (group or dist.group.WORLD).group_name
    view = Group(pg=group, rank=ranks.index(me), size=len(ranks), ranks=ranks, backend=backend,
                 name=name, wire=TorchWire(group, backend))
    GROUPS.views[id(group)] = view
    return view


def shared_group(ranks: Sequence[int], purpose: str = "") -> Any:
    """dist.new_group(ranks), made once per process for each (ranks, purpose) and reused.

    Collective over the whole world, like new_group: every rank asks for the
    same groups in the same order, so every rank finds the same ones already
    made. Why reuse: each gloo group keeps its own threads, and gloo's socket
    loop wakes every 10 ms, so a program that builds the same mesh again (a
    test suite, a retry in the same processes) would otherwise pay for every
    copy forever (measured: a pool of 8 ranks holding ~180 groups each spent
    most of 2 cores in those wake-ups). `purpose` keeps apart groups of the
    same ranks that must not share a stream (a pipeline's header groups).
    """
    key = (tuple(ranks), purpose)
    world = dist.group.WORLD
    made = GROUPS.made.get(key)
    if made is not None and made[0] is world:  # made in this world, not an earlier one
        return made[1]
    pg = dist.new_group(list(ranks))
    GROUPS.made[key] = (world, pg)
    return pg


def default_device(group: Group | None = None) -> torch.device:
    """Where this group's tensors live: the current CUDA device under NCCL, else the CPU."""
    backend = group.backend if group is not None else dist.get_backend()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
