"""The wire: every byte dt moves goes through this package.

Collectives never call torch.distributed directly. They ask for a `Comm` (a
group seen from one rank, bound to one collective call) and use its
`isend` / `irecv` / `exchange`. That one choke point is what lets dt

- count bytes and messages per rank and per collective (`traffic()`, accounting.py),
- turn a deadlock into an error that names the collective, the step and the
  peer it was waiting on (`set_timeout`, comm.py; how long: settings.timeout_for),
- hear of a failed rank within a second and stop waiting on it, naming the
  rank where the failure started (liveness.py),
- check, before a collective moves any data, that every rank of the group
  called the same collective with compatible arguments (`set_validation`),
- run collectives asynchronously, in issue order, on one communication
  thread per group (`submit`, asynchronous.py), which is what data parallel
  overlaps with backward.

Files: errors.py, settings.py (timeouts: `timeout_for`, the one rule;
validation; the transport), liveness.py (failed ranks, announced so waits
end at once), wire.py (what carries bytes: torch.distributed), group.py (a
group from one rank's view), topology.py (which ranks share a host; discover.py
finds it), connect.py (each peer's wire, once per group), parts.py (some of a group's
ranks as a group over its wires: hierarchical collectives' hosts and rails), shm/ (the shared-memory wire:
segments, syncs, channels, the board of load/store algorithms, shared
allocations), accounting.py, comm.py (point-to-point with context), rules.py
(NCCL's rules, checked on the CPU), asynchronous.py, p2p.py (torch-shaped
isend/irecv/batch_isend_irecv for users), state.py (everything the transport remembers
between calls, in one object, and `reset()`).
"""

from dt.transport import liveness
from dt.transport.accounting import Counts, TrafficRecord, account, charge_target, charged_to, traffic
from dt.transport.asynchronous import Work, submit
from dt.transport.comm import Comm, Handle
from dt.transport.connect import board, connect, topology_of
from dt.transport.errors import CollectiveError, CollectiveTimeout, everywhere, is_everywhere, timed_out
from dt.transport.group import Group, default_device, resolve_group, shared_group
from dt.transport.p2p import P2POp, P2PWork, batch_isend_irecv, irecv, isend, recv, send
from dt.transport.parts import part
from dt.transport.settings import (
    Timeout,
    call_timeout,
    get_timeout,
    get_transport,
    group_timeout,
    set_timeout,
    set_transport,
    set_validation,
    timeout_for,
    validation_enabled,
)
from dt.transport.shm.alloc import allocate, is_shared
from dt.transport.state import STATE, TransportState, reset
from dt.transport.topology import Topology
from dt.transport.wire import RECV, SEND, TorchWire, Wire

__all__ = [
    "RECV",
    "SEND",
    "STATE",
    "CollectiveError",
    "CollectiveTimeout",
    "Comm",
    "Counts",
    "Group",
    "Handle",
    "P2POp",
    "P2PWork",
    "Timeout",
    "Topology",
    "TorchWire",
    "TrafficRecord",
    "TransportState",
    "Wire",
    "Work",
    "account",
    "allocate",
    "batch_isend_irecv",
    "board",
    "call_timeout",
    "charge_target",
    "charged_to",
    "connect",
    "default_device",
    "everywhere",
    "get_timeout",
    "get_transport",
    "group_timeout",
    "irecv",
    "is_everywhere",
    "is_shared",
    "liveness",
    "part",
    "isend",
    "recv",
    "reset",
    "resolve_group",
    "shared_group",
    "send",
    "set_timeout",
    "set_transport",
    "set_validation",
    "submit",
    "timed_out",
    "timeout_for",
    "topology_of",
    "traffic",
    "validation_enabled",
]
