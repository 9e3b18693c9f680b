"""Cross-rank argument checks: the same clear error on every rank, never a hang.

Before a collective moves data, each rank publishes a signature: which
collective it called (and the how-many-th on this group), the algorithm,
dtype, op and root, whether its own arguments were valid, and its *logical
traffic matrix row*: how many elements it will send to and expects to receive
from each rank. One Bruck all-gather (ceil(lg p) messages of 8(8 + 2p) bytes)
gives every rank every row, and every rank then runs the same checks:

- everyone called the same collective, the same number of times, with the
  same algorithm, dtype, op and root;
- rank i sends rank j exactly what j expects from i (S_i[j] == R_j[i]);
  this one rule catches mismatched lengths, uneven lists that disagree, and
  all_to_all splits that do not line up;
- nobody rejected their own arguments.

Without it, a length mismatch makes gloo abort the receiving process and a
skipped call hangs until the timeout.
"""

from __future__ import annotations

import zlib
from collections import defaultdict

import torch

from dt import transport
from dt.collectives.bruck import bruck_rounds
from dt.transport import Comm, Group

HEADER = ("collective", "algorithm", "call number", "dtype", "op", "root", "argument error", "spare")
_names: dict[int, str] = {}
_call_numbers: dict[tuple[int, ...], int] = defaultdict(int)


def _code(name: str) -> int:
    code = zlib.crc32(name.encode()) & 0x7FFFFFFF
    _names[code] = name
    return code


def _name(code: int) -> str:
    """Decode a peer's code, including names this rank never used itself."""
    if code not in _names:
        from dt.collectives.registry import ALGORITHMS

        for collective, algorithms in ALGORITHMS.items():
            for word in (collective, *algorithms):
                _code(word)
    return _names.get(code, f"<unknown {code}>")


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
    p = g.size
    _call_numbers[g.key] += 1
    row = [
        _code(collective),
        _code(algorithm),
        _call_numbers[g.key],
        _code(str(dtype)),
        _code(str(op)),
        -1 if root is None else root,
        1 if local_error else 0,
        0,
    ]
    row += list(send[:p]) + [0] * (p - len(send)) + list(recv[:p]) + [0] * (p - len(recv))
    table = torch.empty((p, len(row)), dtype=torch.int64, device=device)
    table[0] = torch.tensor(row, dtype=torch.int64, device=device)
    with transport.charged_to("validate", "bruck"):
        # Named after the call it guards: a rank that never makes that call
        # leaves its peers waiting here, and the timeout should say on what.
        comm = Comm(g, f"validate({collective} call {_call_numbers[g.key]})", "bruck")
        bruck_rounds(comm, table)
    rows = torch.roll(table, shifts=g.rank, dims=0).tolist()  # row i = group rank i
    who = g.ranks
    me = g.ranks[g.rank]

    if local_error:
        raise ValueError(f"{collective}: rank {me}: {local_error}")
    bad = [who[i] for i in range(p) if rows[i][6]]
    if bad:
        raise transport.CollectiveError(
            f"{collective}: rank(s) {bad} rejected their arguments (their own errors say "
            f"why); every rank of the group {list(who)} stops here instead of hanging"
        )
    for f, field in enumerate(HEADER[:6]):
        values = [rows[i][f] for i in range(p)]
        if len(set(values)) > 1:
            j = next(i for i in range(p) if values[i] != values[0])
            shown = [v if f in (2, 5) else _name(v) for v in (values[0], values[j])]
            raise transport.CollectiveError(
                f"{collective}: ranks disagree on the {field}: rank {who[0]} has {shown[0]}, "
                f"rank {who[j]} has {shown[1]}"
                + (" (a rank skipped or added a collective)" if f == 2 else "")
            )
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
