"""`dt demo primitives`: what every rank holds after each collective, on 4 processes.

Rank r starts with [10r, 10r+1, 10r+2, 10r+3]. The demo prints each rank's
result after all_reduce, reduce_scatter, all_gather and all_to_all, checks
that reduce_scatter followed by all_gather equals all_reduce, and prints the
bytes each rank sent in a ring all-reduce of 1 MiB next to 2(p-1)/p * S.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from dt import args as args_
from dt import collectives as C
from dt import cost, transport
from dt.device import DEVICES, backend_for
from dt.launcher import launch


def _primitives(payload_bytes: int) -> dict:
    r, p = dist.get_rank(), dist.get_world_size()
    start = torch.arange(4, dtype=torch.float32) + 10 * r
    out: dict = {"start": start.tolist()}

    x = start.clone()
    C.all_reduce(x, algorithm="ring")
    out["all_reduce"] = x.tolist()

    pieces = list(start.tensor_split(p))
    shard = torch.empty_like(pieces[r])
    C.reduce_scatter(shard, [t.clone() for t in pieces])
    out["reduce_scatter"] = shard.tolist()

    gathered = [torch.empty_like(t) for t in pieces]
    C.all_gather(gathered, shard)
    out["reduce_scatter + all_gather"] = torch.cat(gathered).tolist()

    everyone = [torch.empty(4) for _ in range(p)]
    C.all_gather(everyone, start)
    out["all_gather"] = [t.tolist() for t in everyone]

    received = [torch.empty_like(t) for t in pieces]
    C.all_to_all(received, [t.clone() for t in pieces])
    out["all_to_all"] = torch.cat(received).tolist()

    big = torch.ones(payload_bytes // 4)
    transport.set_validation(False)  # count only the algorithm's own bytes
    with transport.traffic() as t:
        C.all_reduce(big, algorithm="ring")
    out["ring_bytes_sent"] = t.bytes_sent
    out["ring_messages_sent"] = t.messages_sent
    model = cost.ring_all_reduce(big.numel(), 4, p, r)
    out["model_bytes_sent"] = model.bytes_sent
    return out


def main(argv: list[str] | None = None) -> int:
    parser = args_.Parser(prog="dt demo", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["primitives"])
    parser.add_argument("--world", type=args_.world, default=4)
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="cpu (gloo), cuda (NCCL, one GPU per rank) or auto (cuda when there is one)")
    parser.add_argument("--bytes", type=args_.size, default=1 << 20, help="ring all-reduce payload")
    args = parser.parse_args(argv)

    results = launch(_primitives, args.world, args.bytes, timeout=120, backend=backend_for(args.device))
    if dist.is_initialized():  # under torchrun: this process is one rank; rank 0 prints its view
        if dist.get_rank() != 0:
            return 0
        p = dist.get_world_size()
    else:
        p = len(results)
    fmt = lambda v: "[" + ", ".join(f"{x:g}" for x in v) + "]"  # noqa: E731
    for key in ("start", "all_reduce", "reduce_scatter", "reduce_scatter + all_gather", "all_to_all"):
        print(f"\n{key}")
        for r, res in enumerate(results):
            print(f"  rank {r}: {fmt(res[key])}")
    print("\nall_gather (every rank holds the same list)")
    print(f"  rank 0: {[fmt(v) for v in results[0]['all_gather']]}")

    ok = all(res["reduce_scatter + all_gather"] == res["all_reduce"] for res in results)
    print(f"\nreduce_scatter + all_gather == all_reduce on every rank: {'yes' if ok else 'NO'}")

    size = args.bytes
    print(f"\nring all-reduce of {size:,} bytes on {p} ranks: bytes sent per rank "
          f"(model: 2(p-1)/p * S = {2 * (p - 1) / p * size:,.0f})")
    print(f"  {'rank':>4}  {'measured':>12}  {'model':>12}  {'messages':>8}")
    for r, res in enumerate(results):
        print(f"  {r:>4}  {res['ring_bytes_sent']:>12,}  {res['model_bytes_sent']:>12,}  "
              f"{res['ring_messages_sent']:>8}")
    exact = all(res["ring_bytes_sent"] == res["model_bytes_sent"] for res in results)
    print(f"  measured == model: {'yes' if exact else 'NO'}")
    return 0 if ok and exact else 1
