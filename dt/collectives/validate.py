"""Cross-rank argument checks: the same clear error on every rank, never a hang.

Before a collective moves data, each rank publishes a signature: which
collective it called (and the how-many-th on this group), the algorithm,
dtype, op and root, whether its own arguments were valid, and its *logical
traffic matrix row*: how many elements it will send to and expects to receive
from each rank. One all-gather gives every rank every row (on a group of one
shared-memory segment a load/store one: one synchronisation; elsewhere Bruck's:
ceil(lg p) messages of 8(8 + 2p) bytes), and every rank then runs the same checks:

- everyone called the same collective, the same number of times (counted
  per group: two groups with the same members count apart);
- nobody rejected their own arguments;
- everyone passed the same dtype, op and root;
- rank i sends rank j exactly what j expects from i (S_i[j] == R_j[i]);
  this one rule catches mismatched lengths, uneven lists that disagree, and
  all_to_all splits that do not line up;
- and only then the same algorithm, since "auto" picks it from the sizes.

Every field travels as a number every rank can decode (names as CRC-32s of
a vocabulary every rank holds), so every rank raises the same text.

Without it, a length mismatch makes gloo abort the receiving process and a
skipped call hangs until the timeout.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import threading
import zlib
from collections import defaultdict

import torch

from dt import transport
from dt.collectives.bruck import bruck_rounds
from dt.collectives.ops import OP_NAMES
from dt.transport import Comm, Group, accounting

HEADER = ("collective", "call number", "argument error", "dtype", "op", "root", "algorithm", "spare")
COLLECTIVE, CALL, ARG_ERROR, DTYPE, OP, ROOT, ALGORITHM = range(7)
_names: dict[int, str] = {}
# Calls so far, per group: keyed by the group's identity (its name and members), so two
# groups with the same members, used from two threads, count their calls apart.
_call_numbers: dict[tuple, int] = defaultdict(int)
_count_lock = threading.Lock()


def _code(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def _name(code: int) -> str:
    """Decode a peer's code: every name a rank can send is in the vocabulary, on every rank."""
    if not _names:
        from dt.collectives.registry import ALGORITHMS

        words = {"None", "auto", "shm_empty", "shared", *OP_NAMES, *(str(d) for d in vars(torch).values()
                                             if isinstance(d, torch.dtype))}
        for collective, algorithms in ALGORITHMS.items():
            words.update((collective, *algorithms))
        _names.update({_code(w): w for w in words})
    return _names.get(code, f"<unknown {code}>")


def _next_call(g: Group) -> int:
    with _count_lock:
        _call_numbers[g.key] += 1
        return _call_numbers[g.key]

def signature(collective: str, algorithm: str, *, dtype: torch.dtype | None, op: str | None,
              root: int | None, send: list[int], recv: list[int], local_error: str | None,
              p: int) -> list[int]:
    """This rank's signature row for one call, its call number left 0 (`check` sets it): the
    same for every call of one shape, so a group's plan (dt.collectives.plan) makes it once."""
    row = [0] * len(HEADER)
    row[COLLECTIVE], row[ARG_ERROR] = _code(collective), 1 if local_error else 0
    row[DTYPE], row[OP], row[ROOT] = _code(str(dtype)), _code(str(op)), -1 if root is None else root
    row[ALGORITHM] = _code(algorithm)
    return row + list(send[:p]) + [0] * (p - len(send)) + list(recv[:p]) + [0] * (p - len(recv))


def validate(
    g: Group,
    collective: str,
    algorithm: str,
    *,
    dtype: torch.dtype | None,
    op: str | None,
    root: int | None,
    send: list[int],
    recv: list[int],
    local_error: str | None,
    device: torch.device,
) -> None:
    """Raise the same CollectiveError on every rank if the ranks disagree."""
    check(g, collective, signature(collective, algorithm, dtype=dtype, op=op, root=root, send=send,
                                   recv=recv, local_error=local_error, p=g.size), local_error, device)


def exchange_algorithm(g: Group, device: torch.device) -> str:
    """How the signatures travel: on a group of one shared-memory segment (CPU tensors) one
    load/store all-gather ("one_shot": a synchronisation, ~20 us on the 2-core box), else
    Bruck's all-gather over the group's messages ("bruck": ceil(lg p) exchange steps, each
    ~90-140 us on the shared-memory wire's channels, ~300 us on gloo)."""
    return "one_shot" if g.links.board is not None and device.type == "cpu" else "bruck"


def check(g: Group, collective: str, row: list[int], local_error: str | None,
          device: torch.device) -> None:
    """Exchange this rank's signature `row` (from `signature`) and run the checks on every row."""
    p = g.size
    call = _next_call(g)
    row = list(row)
    row[CALL] = call
    exchange = exchange_algorithm(g, device)
    # Named after the call it guards: a rank that never makes that call
    # leaves its peers waiting here, and the timeout should say on what.
    name = f"validate({collective} call {call})"
    # Charged only while a dt.traffic() block is open (counted nowhere else): a fast call
    # (dt.collectives.plan) then makes no call into the accounting at all.
    with transport.charged_to("validate", exchange) if accounting.open_records else contextlib.nullcontext():
        rows = _on_board(g, name, row) if exchange == "one_shot" else _by_bruck(g, name, row, device)
    who = g.ranks
    me = g.ranks[g.rank]

    # The checks, in an order that names the first thing a user got wrong: what was
    # called, then the arguments, and the algorithm last, since "auto" chooses it from
    # the sizes (a size mismatch is a size mismatch, not an algorithm disagreement).
    _agree(rows, who, collective, COLLECTIVE, " (a rank called another collective)")
    _agree(rows, who, collective, CALL, " (a rank skipped or added a collective)")
    if local_error:
        raise transport.everywhere(ValueError(f"{collective}: rank {me}: {local_error}"))
    bad = [who[i] for i in range(p) if rows[i][ARG_ERROR]]
    if bad:
        raise transport.CollectiveError(
            f"{collective}: rank(s) {bad} rejected their arguments (their own errors say "
            f"why); every rank of the group {list(who)} stops here instead of hanging"
        )
    for field in (DTYPE, OP, ROOT):
        _agree(rows, who, collective, field)
    base = len(HEADER)
    for i in range(p):
        for j in range(p):
            sends = rows[i][base + j]
            expects = rows[j][base + p + i]
            if sends != expects:
                raise transport.CollectiveError(
                    f"{collective}: rank {who[i]} would send {sends} elements to rank {who[j]}, "
                    f"which expects {expects} from it: tensor sizes disagree across ranks"
                )
    _agree(rows, who, collective, ALGORITHM)


def _by_bruck(g: Group, name: str, row: list[int], device: torch.device) -> list[list[int]]:
    """Every rank's row by Bruck's all-gather over the group's messages; row i = group rank i's."""
    table = torch.empty((g.size, len(row)), dtype=torch.int64, device=device)
    table[0] = torch.tensor(row, dtype=torch.int64, device=device)
    bruck_rounds(Comm(g, name, "bruck"), table)  # this rank's row first: row k is rank (rank + k) % p's
    return torch.roll(table, shifts=g.rank, dims=0).tolist()


def _on_board(g: Group, name: str, row: list[int]) -> list[list[int]]:
    """Every rank's row through the group's shared-memory board: each writes its row into its
    staging, one synchronisation, each reads all p rows (a one-shot all-gather of p rows of
    8 (8 + 2p) bytes, without a tensor op but the read)."""
    board = g.links.board
    call = board.call(name, "one_shot")  # what a failed sync's error names
    nbytes = 8 * len(row)
    parity = board.publish_staged(nbytes)
    packed = array.array("q", row)
    ctypes.memmove(board.staging(g.rank, parity).data_ptr(), packed.buffer_info()[0], nbytes)
    call.sync()
    rows = board.staged_rows(parity, torch.int64, 0, len(row)).tolist()
    if accounting.open_records:  # dt.traffic(): what each peer read from this rank, and it from them
        for j in range(g.size):
            if j != g.rank:
                call.count(j, sent=nbytes, received=nbytes)
    return rows


def _agree(rows: list[list[int]], who: tuple[int, ...], collective: str, field: int,
           hint: str = "") -> None:
    """Raise, with the same text on every rank, if the ranks' rows differ in `field`."""
    values = [row[field] for row in rows]
    j = next((i for i, v in enumerate(values) if v != values[0]), None)
    if j is None:
        return
    shown = [v if field in (CALL, ROOT) else _name(v) for v in (values[0], values[j])]
    raise transport.CollectiveError(
        f"{collective}: ranks disagree on the {HEADER[field]}: rank {who[0]} has {shown[0]}, "
        f"rank {who[j]} has {shown[1]}{hint}"
    )
