"""Sparse COO all-reduce, as gloo does it: coalesce, all-gather indices and values, sum.

A sparse tensor's nonzeros sit at different places on different ranks, so
there is no buffer to reduce chunk by chunk as the ring does. gloo's sparse
all-reduce (ProcessGroupGloo) gathers everything instead, and so does this:

1. coalesce locally (sorted, unique indices, duplicates summed);
2. all-gather a small header from every rank: its nnz and a fingerprint of
   its shape, sparse/dense split and dtype. Every rank checks the fingerprints
   and raises the same error if they differ, before any payload moves;
3. all-gather the indices (sparse_dim x nnz_r int64 from rank r) and the
   values (nnz_r x dense elements): uneven blocks, one per rank;
4. concatenate and coalesce: entries several ranks hold are summed.

Only ReduceOp.SUM, as gloo. The caller's tensor becomes the (coalesced) sum.

Cost, charged to all_reduce[sparse] in dt.traffic(): a Bruck all-gather of
HEADER int64 per rank (dt.cost.bruck_all_gather), then two ring all-gathers
(dt.cost.ring_all_gather) with blocks sparse_dim*nnz_r int64 and
nnz_r*dense values; every rank ends up receiving every other rank's nonzeros,
so the bytes grow with p * nnz, where a dense all-reduce's do not grow with p.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch

from dt import transport
from dt.collectives.ops import check_reducible, op_name
from dt.collectives.registry import lookup
from dt.collectives.validate import validate
from dt.transport import Group

HEADER = 2  # int64 per rank: nnz, fingerprint


def _fingerprint(t: torch.Tensor) -> int:
    what = f"{tuple(t.shape)} sparse_dim={t.sparse_dim()} {t.dtype}"
    return zlib.crc32(what.encode()) & 0x7FFFFFFF


def _local_error(tensor: torch.Tensor, op: Any) -> str | None:
    try:
        name = op_name(op)
    except ValueError as exc:
        return str(exc)
    if name != "SUM":
        return ("unsupported reduction operation (allreduce of sparse tensors only works with "
                f"ReduceOp.SUM), got ReduceOp.{name}")
    return check_reducible("SUM", tensor.dtype)


def all_reduce(tensor: torch.Tensor, op: Any, g: Group, async_op: bool) -> Any:
    """Sum a sparse COO `tensor` over the group, in place (dt.all_reduce sends sparse tensors here)."""
    local_error = _local_error(tensor, op)
    if local_error and not transport.validation_enabled():
        raise ValueError(f"all_reduce: rank {g.ranks[g.rank]}: {local_error}")
    p = g.size

    def job() -> list[torch.Tensor]:
        if transport.validation_enabled():
            validate(g, "all_reduce", "sparse", dtype=tensor.dtype, op="SUM", root=None,
                     send=[HEADER] * p, recv=[HEADER] * p, local_error=local_error,
                     device=tensor.device)
        with transport.charged_to("all_reduce", "sparse"):
            _sum(tensor, g)
        return [tensor]

    work = transport.submit(g, "all_reduce", job, async_op)
    return work if async_op else None


def _sum(tensor: torch.Tensor, g: Group) -> None:
    p, device = g.size, tensor.device
    local = tensor.coalesce()
    indices, values = local.indices(), local.values()
    nnz = indices.shape[1]
    header = torch.empty(p * HEADER, dtype=torch.int64, device=device)
    mine = torch.tensor([nnz, _fingerprint(local)], dtype=torch.int64, device=device)
    lookup("all_gather_into_tensor", "bruck")(header, mine, g)
    counts, prints = header.view(p, HEADER).t().tolist()
    if len(set(prints)) > 1:
        odd = [g.ranks[i] for i in range(p) if prints[i] != prints[0]]
        raise transport.CollectiveError(
            f"all_reduce: sparse tensors differ in shape, sparse dims or dtype across ranks: "
            f"rank(s) {odd} differ from rank {g.ranks[0]}, whose tensor is "
            f"{tuple(local.shape)} {local.dtype} with sparse_dim={local.sparse_dim()}")
    sparse_dim = indices.shape[0]
    dense = math.prod(values.shape[1:])
    all_indices = [torch.empty(sparse_dim * c, dtype=torch.int64, device=device) for c in counts]
    all_values = [torch.empty(dense * c, dtype=values.dtype, device=device) for c in counts]
    gather = lookup("all_gather", "ring")
    gather(all_indices, indices.contiguous().view(-1), g)
    gather(all_values, values.contiguous().view(-1), g)
    total = torch.cat([i.view(sparse_dim, c) for i, c in zip(all_indices, counts)], dim=1)
    summed = torch.cat([v.view(c, *values.shape[1:]) for v, c in zip(all_values, counts)])
    tensor.copy_(torch.sparse_coo_tensor(total, summed, local.shape).coalesce())
