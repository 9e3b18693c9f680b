"""`dt demo primitives`: what every rank holds before and after each collective.

Rank r starts with [10r, 10r+1, 10r+2, 10r+3]. The demo runs broadcast,
reduce, all_reduce, reduce_scatter, all_gather, gather, scatter and
all_to_all on it and prints one table per collective (rank, before, after;
" | " separates the pieces a rank sends or receives, "-" is an empty piece
and "(none)" a rank that passes no list or whose result is undefined). The 4 elements are
split over p ranks as dt.layout.split_sizes says (3 ranks: 2, 1, 1), so at
3, 5 or 8 ranks the pieces are uneven and some are empty. It checks that
reduce_scatter followed by all_gather equals all_reduce, and prints the bytes
each rank sent in a ring all-reduce of 1 MiB next to 2(p-1)/p * S.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.distributed as dist

from dt import args as args_
from dt import collectives as C
from dt import cost, transport
from dt.device import DEVICES, backend_for
from dt.launcher import launch
from dt.layout import split_sizes
from dt.units import plural

__all__ = ["COLLECTIVES", "ROOT", "byte_count", "main", "primitives", "render", "start_of"]

ROOT = 0  # broadcast's and scatter's source, reduce's and gather's destination
ELEMENTS = 4

# name -> its table's title: what every rank holds afterwards.
COLLECTIVES = {
    "broadcast": f"broadcast from rank {ROOT}: every rank ends with rank {ROOT}'s tensor",
    "reduce": f"reduce (sum) to rank {ROOT}: only rank {ROOT} holds the sum",
    "all_reduce": "all_reduce (sum): every rank ends with the elementwise sum",
    "reduce_scatter": "reduce_scatter (sum): rank i keeps piece i of the sum",
    "all_gather": "all_gather: every rank ends with every rank's tensor, in rank order",
    "reduce_scatter + all_gather": "reduce_scatter + all_gather: the shards above, all-gathered, "
                                   "make all_reduce's result",
    "gather": f"gather to rank {ROOT}: it ends with every rank's tensor",
    "scatter": f"scatter from rank {ROOT}: rank i gets piece i of rank {ROOT}'s tensor",
    "all_to_all": "all_to_all: rank i sends its piece j to rank j, so rank j ends with piece j of every rank",
}


def start_of(rank: int) -> torch.Tensor:
    """What rank `rank` starts with: [10r, 10r+1, 10r+2, 10r+3]."""
    return torch.arange(ELEMENTS, dtype=torch.float32) + 10 * rank


def _pieces(ts: list[torch.Tensor]) -> list[list[float]]:
    return [t.tolist() for t in ts]


def primitives(payload_bytes: int) -> dict[str, Any]:
    """One rank: {collective: {"before": pieces, "after": pieces or None}} and the ring's bytes.

    None is "nothing": a rank that passes no list (scatter's and gather's
    non-roots) or whose tensor the collective leaves undefined (reduce's).
    """
    r, p = dist.get_rank(), dist.get_world_size()
    sizes = split_sizes(ELEMENTS, p)  # the one rule for both the pieces sent and those received
    dev = transport.default_device()  # the rank's GPU under NCCL (which takes no CPU tensor)
    start = start_of(r).to(dev)
    split = list(start.split(sizes))
    out: dict[str, Any] = {"world": p, "sizes": sizes}

    x = start.clone()
    C.broadcast(x, src=ROOT)
    out["broadcast"] = {"before": [start.tolist()], "after": [x.tolist()]}

    x = start.clone()
    C.reduce(x, dst=ROOT)
    out["reduce"] = {"before": [start.tolist()], "after": [x.tolist()] if r == ROOT else None}

    summed = start.clone()
    C.all_reduce(summed, algorithm="ring")
    out["all_reduce"] = {"before": [start.tolist()], "after": [summed.tolist()]}

    shard = torch.empty(sizes[r], device=dev)
    C.reduce_scatter(shard, [t.clone() for t in split])
    out["reduce_scatter"] = {"before": _pieces(split), "after": [shard.tolist()]}

    everyone = [torch.empty(ELEMENTS, device=dev) for _ in range(p)]
    C.all_gather(everyone, start)
    out["all_gather"] = {"before": [start.tolist()], "after": _pieces(everyone)}

    shards = [torch.empty(n, device=dev) for n in sizes]
    C.all_gather(shards, shard)
    out["reduce_scatter + all_gather"] = {"before": [shard.tolist()], "after": _pieces(shards)}

    gathered = [torch.empty(ELEMENTS, device=dev) for _ in range(p)] if r == ROOT else None
    C.gather(start, gathered, dst=ROOT)
    out["gather"] = {"before": [start.tolist()], "after": _pieces(gathered) if gathered else None}

    piece = torch.empty(sizes[r], device=dev)
    C.scatter(piece, [t.clone() for t in split] if r == ROOT else None, src=ROOT)
    out["scatter"] = {"before": _pieces(split) if r == ROOT else None, "after": [piece.tolist()]}

    received = [torch.empty(sizes[r], device=dev) for _ in range(p)]  # piece r of every rank: sizes[r] each
    C.all_to_all(received, [t.clone() for t in split])
    out["all_to_all"] = {"before": _pieces(split), "after": _pieces(received)}

    big = torch.ones(payload_bytes // 4, device=dev)
    validating = transport.validation_enabled()
    transport.set_validation(False)  # count only the algorithm's own bytes
    try:
        with transport.traffic() as t:
            C.all_reduce(big, algorithm="ring")
    finally:
        transport.set_validation(validating)  # a reused worker (tests) keeps its setting
    out["ring_bytes_sent"] = t.bytes_sent
    out["ring_messages_sent"] = t.messages_sent
    out["model_bytes_sent"] = cost.ring_all_reduce(big.numel(), 4, p, r).bytes_sent
    out["ring_bytes"] = big.numel() * big.element_size()  # S: --bytes in whole float32 elements
    return out


def _cell(pieces: list[list[float]] | None) -> str:
    """[0, 1 | 2 | 3]: the pieces, '-' for an empty one; '(none)' for nothing."""
    if pieces is None:
        return "(none)"
    return "[" + " | ".join(", ".join(f"{v:g}" for v in piece) or "-" for piece in pieces) + "]"


def byte_count(n: float) -> str:
    """A count of bytes as the ring's table prints it, header and rows alike: whole ones with
    separators (1,398,100), a mean or a formula's fraction to one decimal (1,398,101.3)."""
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.1f}"


def render(results: list[dict[str, Any]], payload_bytes: int) -> tuple[list[str], bool]:
    """The demo's report from every rank's `primitives` result, and whether its checks hold."""
    p = len(results)
    lines = [f"{plural(p, 'rank')}; rank r starts with [10r, 10r+1, 10r+2, 10r+3], split into pieces of "
             f"{', '.join(map(str, results[0]['sizes']))} elements (dt.layout.split_sizes)"]
    for name, title in COLLECTIVES.items():
        rows = [(str(r), _cell(res[name]["before"]), _cell(res[name]["after"]))
                for r, res in enumerate(results)]
        width = max(len("before"), *(len(b) for _, b, _ in rows))
        lines += ["", title, f"  {'rank':>4}  {'before':<{width}}  after"]
        lines += [f"  {r:>4}  {b:<{width}}  {a}" for r, b, a in rows]

    ok = all(sum(res["reduce_scatter + all_gather"]["after"], []) == res["all_reduce"]["after"][0]
             for res in results)
    lines += ["", f"reduce_scatter + all_gather == all_reduce on every rank: {'yes' if ok else 'NO'}"]

    size = results[0]["ring_bytes"]
    lines += ["", f"ring all-reduce of {size:,} bytes on {plural(p, 'rank')}: bytes sent per rank "
                  f"(model: 2(p-1)/p * S = {byte_count(2 * (p - 1) / p * size)}: the ranks' mean, as each "
                  "sends whole elements)",
              f"  {'rank':>4}  {'measured':>12}  {'model':>12}  {'messages':>8}"]
    for r, res in enumerate(results):
        lines.append(f"  {r:>4}  {byte_count(res['ring_bytes_sent']):>12}  "
                     f"{byte_count(res['model_bytes_sent']):>12}  {res['ring_messages_sent']:>8}")
    means = [sum(res[k] for res in results) / p for k in ("ring_bytes_sent", "model_bytes_sent")]
    lines.append(f"  {'mean':>4}  {byte_count(means[0]):>12}  {byte_count(means[1]):>12}")
    exact = all(res["ring_bytes_sent"] == res["model_bytes_sent"] for res in results)
    lines.append(f"  measured == model: {'yes' if exact else 'NO'}")
    return lines, ok and exact


def main(argv: list[str] | None = None) -> int:
    parser = args_.Parser(prog="dt demo", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["primitives"])
    parser.add_argument("--world", type=args_.world, default=4)
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="cpu (gloo), cuda (NCCL, one GPU per rank) or auto (cuda when there is one)")
    parser.add_argument("--bytes", type=args_.size, default=1 << 20, help="ring all-reduce payload")
    args = parser.parse_args(argv)

    results = launch(primitives, args.world, args.bytes, timeout=120, backend=backend_for(args.device))
    if dist.is_initialized() and dist.get_rank() != 0:  # under torchrun: rank 0 prints for all
        return 0
    lines, ok = render(results, args.bytes)
    print("\n".join(lines))
    return 0 if ok else 1
