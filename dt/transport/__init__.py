"""The wire: every byte dt moves goes through this package.

Collectives never call torch.distributed directly. They ask for a `Comm` (a
group seen from one rank, bound to one collective call) and use its
`isend` / `irecv` / `exchange`. That one choke point is what lets dt

- count bytes and messages per rank and per collective (`traffic()`, accounting.py),
- turn a deadlock into an error that names the collective, the step and the
  peer it was waiting on (`set_timeout`, comm.py),
- check, before a collective moves any data, that every rank of the group
  called the same collective with compatible arguments (`set_validation`),
- run collectives asynchronously, in issue order, on one communication
  thread per group (`submit`, asynchronous.py), which is what data parallel
  overlaps with backward.

Files: errors.py, settings.py (timeout, validation, transport), wire.py (what
carries bytes: torch.distributed), group.py (a group from one rank's view),
topology.py (which ranks share a host), connect.py (each peer's wire, once
per group), shm/ (the shared-memory wire: segments, syncs, channels, the
board of load/store algorithms, shared allocations), accounting.py, comm.py
(point-to-point with context), rules.py (NCCL's rules, checked on the CPU),
asynchronous.py, p2p.py (torch-shaped isend/irecv for users).
"""

from dt.transport.accounting import Counts, TrafficRecord, account, charged_to, traffic
from dt.transport.asynchronous import Work, submit
from dt.transport.comm import Comm, Handle
from dt.transport.connect import board, connect, topology_of
from dt.transport.errors import CollectiveError, CollectiveTimeout
from dt.transport.group import Group, default_device, resolve_group
from dt.transport.p2p import irecv, isend, recv, send
from dt.transport.settings import (
    get_timeout,
    get_transport,
    set_timeout,
    set_transport,
    set_validation,
    validation_enabled,
)
from dt.transport.shm.alloc import allocate, is_shared
from dt.transport.topology import Topology
from dt.transport.wire import RECV, SEND, TorchWire, Wire

__all__ = [
    "RECV",
    "SEND",
    "CollectiveError",
    "CollectiveTimeout",
    "Comm",
    "Counts",
    "Group",
    "Handle",
    "Topology",
    "TorchWire",
    "TrafficRecord",
    "Wire",
    "Work",
    "account",
    "allocate",
    "board",
    "charged_to",
    "connect",
    "default_device",
    "get_timeout",
    "get_transport",
    "irecv",
    "is_shared",
    "isend",
    "recv",
    "resolve_group",
    "send",
    "set_timeout",
    "set_transport",
    "set_validation",
    "submit",
    "topology_of",
    "traffic",
    "validation_enabled",
]
