"""Where tensor parallelism sits across hosts: both mesh layouts priced by the two-level model.

`dt train --layout tp-inside` (the default) numbers the mesh tp innermost,
so with each host's ranks contiguous (torchrun's numbering) a tp group is
inside one host; `--layout tp-across` puts tp outermost (dt.parallel.grid's
ORDERS), its groups spread over hosts and dp's kept inside. Per step:

    tp: 4 all-reduces per layer of the stage (Megatron's f and g, attention
        and MLP, forward and backward) and micro-batch, one activation each:
        (batch / dp / micro-batches) sequences x (block / cp) tokens x n_embd
    dp: one all-reduce of this rank's gradients (its stage's parameters)

each priced with dt.cost.levels on the hosts its group's ranks sit on (the
slowest group of each kind; the algorithm the model prices lowest, as auto
picks across hosts) and the figures every rank agreed on (rank 0's `dt tune`
levels, dt.collectives.agreed). Activations of the vocabulary-parallel
embedding and head, and pipeline sends, are left out: the same in both layouts.
"""

from __future__ import annotations

import argparse
import math

from dt.cost.levels import LEVELED, Levels, two_level
from dt.parallel.mesh import mesh_groups

__all__ = ["LAYOUTS", "predict", "step_calls"]

LAYOUTS = {"tp-inside": False, "tp-across": True}


def step_calls(args: argparse.Namespace, grad_bytes: int, itemsize: int) -> dict[str, tuple[int, int]]:
    """(bytes per all-reduce, all-reduces per step) of tp and dp, as the module doc counts them."""
    sequences = args.batch_size // args.dp // args.micro_batches
    activation = sequences * (args.block_size // args.cp) * args.n_embd * itemsize
    layers = math.ceil(args.n_layer / args.pp)
    return {"tp": (activation, 4 * layers * args.micro_batches), "dp": (grad_bytes, 1)}


def _renumbered(hs: list[int]) -> tuple[int, ...]:
    """Host indices 0, 1, ... in order of first appearance (dt.hosts' convention)."""
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(h, len(seen)) for h in hs)


def _all_reduce(nbytes: int, itemsize: int, hosts: tuple[int, ...], levels: Levels) -> float:
    """The lowest two-level time of one all-reduce on a group on `hosts`."""
    if len(hosts) < 2 or nbytes == 0:
        return 0.0
    return min(two_level("all_reduce", a, nbytes // itemsize, itemsize, hosts, levels).total
               for a in LEVELED["all_reduce"])


def predict(args: argparse.Namespace, hosts: tuple[int, ...], levels: Levels, grad_bytes: int,
            itemsize: int) -> dict[str, dict[str, float]]:
    """Per layout: predicted seconds per step of tp's and dp's all-reduces, and their sum."""
    calls = step_calls(args, grad_bytes, itemsize)
    out = {}
    for name, across in LAYOUTS.items():
        groups = mesh_groups(args.dp, args.tp, args.pp, args.cp, args.ep, across)
        row = {}
        for kind, (nbytes, count) in calls.items():
            row[kind] = count * max(_all_reduce(nbytes, itemsize, _renumbered([hosts[r] for r in g]), levels)
                                    for g in groups[kind])
        row["total"] = row["tp"] + row["dp"]
        out[name] = row
    return out
