"""What the judge knows about each collective it judges.

For each one: torch's signature (the learner writes a function with it), how
a case's arguments are built on a rank, how torch's own collective (the
reference, called in the same process on a copy of the same arguments) and
dt's algorithm run on them, which tensors hold the result, and which dt.cost
figure the traffic is held to. Inputs are small integers, so sums and
products are exact in every dtype and reduction order: a difference is a
bug, not rounding.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dt import cost
from dt.learn.judge.cases import JudgeCase, blocks, matrix, root, torch_dtype
from dt.learn.judge.instrument import original

__all__ = ["SPECS", "GroupView", "Spec", "data"]


@dataclass(frozen=True)
class GroupView:
    """The case's group from one rank: torch's handle (None = the world), members, this rank."""

    pg: Any
    ranks: tuple[int, ...]
    rank: int  # in the group

    @property
    def size(self) -> int:
        return len(self.ranks)


def data(case: JudgeCase, rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank `rank`'s deterministic input: small integers, exact under any reduction order."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{case.dtype}/{rank}/{salt}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if case.op == "PRODUCT":
        return torch.randint(1, 3, (n,), generator=g).to(dtype)  # 1 or 2: 2^8 at most on 8 ranks
    low = 0 if dtype == torch.uint8 else -4
    return torch.randint(low, low + 9, (n,), generator=g).to(dtype)


def unwritten(n: int, dtype: torch.dtype) -> torch.Tensor:
    """An output buffer before the call: NaN (or 111) where nothing was written."""
    if dtype == torch.bool:
        return torch.zeros(n, dtype=dtype)
    return torch.full((n,), float("nan") if dtype.is_floating_point else 111, dtype=dtype)


class Spec:
    """One collective: torch's signature, its arguments per case, its reference, its cost."""

    name = ""
    signature = ""
    optimal = ""  # the dt.cost algorithm whose bytes are the default target (bandwidth-optimal)
    takes_op = False
    busbw = ""  # dt.cost.BUSBW_FACTOR key
    messages_matter = False  # fewer messages is the point (bucketing): more than the target fails
    allow_dt = False  # may call dt's own collectives (the gradient sync is about buckets, not the ring)

    def make(self, case: JudgeCase, g: GroupView) -> tuple[list[Any], Any]:
        """(positional arguments, torch ReduceOp or None) on this rank, inputs filled."""
        raise NotImplementedError

    def outputs(self, args: list[Any]) -> list[tuple[str, torch.Tensor]]:
        raise NotImplementedError

    def torch_call(self, args: list[Any], op: Any, g: GroupView) -> None:
        """torch's own collective on `args`, in place."""
        raise NotImplementedError

    def dt_call(self, args: list[Any], op: Any, g: GroupView, algorithm: str) -> None:
        raise NotImplementedError

    def target(self, case: JudgeCase, p: int, rank: int, algorithm: str) -> cost.RankTraffic:
        """dt.cost's traffic of `algorithm` for group rank `rank` of p on this case."""
        raise NotImplementedError

    def payload(self, args: list[Any], p: int) -> int:
        """S in bytes, as nccl-tests counts it (busbw)."""
        raise NotImplementedError

    def itemsize(self, case: JudgeCase) -> int:
        return torch.empty(0, dtype=torch_dtype(case.dtype)).element_size()


def _op(case: JudgeCase) -> Any:
    return getattr(dist.ReduceOp, case.op)


def _tensor(case: JudgeCase, g: GroupView) -> torch.Tensor:
    n = case.size(g.size)
    x = data(case, g.ranks[g.rank], n, torch_dtype(case.dtype))
    return x.view(case.shape) if case.shape else x


class AllReduce(Spec):
    name = "all_reduce"
    signature = "all_reduce(tensor, op=ReduceOp.SUM, group=None)"
    optimal = "ring"
    takes_op = True
    busbw = "all_reduce"

    def make(self, case, g):
        return [_tensor(case, g)], _op(case)

    def outputs(self, args):
        return [("tensor", args[0])]

    def torch_call(self, args, op, g):
        original("all_reduce")(args[0], op=op, group=g.pg)

    def dt_call(self, args, op, g, algorithm):
        import dt

        dt.all_reduce(args[0], op, g.pg, algorithm=algorithm)

    def target(self, case, p, rank, algorithm):
        return cost.traffic_for("all_reduce", algorithm, case.size(p), self.itemsize(case), p, rank)

    def payload(self, args, p):
        return args[0].numel() * args[0].element_size()


class ReduceScatter(Spec):
    name = "reduce_scatter"
    signature = "reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None)"
    optimal = "ring"
    takes_op = True
    busbw = "reduce_scatter"

    def make(self, case, g):
        dtype, me = torch_dtype(case.dtype), g.ranks[g.rank]
        sizes = blocks(case, g.size)
        inputs = [data(case, me, n, dtype, salt=j) for j, n in enumerate(sizes)]
        return [unwritten(sizes[g.rank], dtype), inputs], _op(case)

    def outputs(self, args):
        return [("output", args[0])]

    def torch_call(self, args, op, g):
        original("reduce_scatter")(args[0], list(args[1]), op=op, group=g.pg)

    def dt_call(self, args, op, g, algorithm):
        import dt

        dt.reduce_scatter(args[0], list(args[1]), op, g.pg, algorithm=algorithm)

    def target(self, case, p, rank, algorithm):
        return cost.traffic_for("reduce_scatter", algorithm, blocks(case, p), self.itemsize(case), p, rank)

    def payload(self, args, p):
        return sum(t.numel() for t in args[1]) * args[0].element_size()


class AllGather(Spec):
    name = "all_gather"
    signature = "all_gather(tensor_list, tensor, group=None)"
    optimal = "ring"
    busbw = "all_gather"

    def make(self, case, g):
        dtype, me = torch_dtype(case.dtype), g.ranks[g.rank]
        sizes = blocks(case, g.size)
        return [[unwritten(n, dtype) for n in sizes], data(case, me, sizes[g.rank], dtype)], None

    def outputs(self, args):
        return [(f"tensor_list[{i}]", t) for i, t in enumerate(args[0])]

    def torch_call(self, args, op, g):
        # gloo's all_gather takes equal blocks only: gather padded, then trim.
        out, mine = args[0], args[1]
        width = max(t.numel() for t in out)
        if width == 0:
            return
        padded = torch.zeros(width, dtype=mine.dtype)
        padded[: mine.numel()] = mine
        landing = [torch.empty_like(padded) for _ in out]
        original("all_gather")(landing, padded, group=g.pg)
        for t, got in zip(out, landing):
            t.copy_(got[: t.numel()])

    def dt_call(self, args, op, g, algorithm):
        import dt

        dt.all_gather(args[0], args[1], g.pg, algorithm=algorithm)

    def target(self, case, p, rank, algorithm):
        return cost.traffic_for("all_gather", algorithm, blocks(case, p), self.itemsize(case), p, rank)

    def payload(self, args, p):
        return sum(t.numel() for t in args[0]) * args[1].element_size()


class Broadcast(Spec):
    name = "broadcast"
    signature = "broadcast(tensor, src, group=None)"
    optimal = "ring"  # the chain: every rank sends n at most, the least any rank can send
    busbw = "broadcast"

    def make(self, case, g):
        src = root(case, g.size)
        x = _tensor(case, g)
        if g.rank != src:
            x = unwritten(x.numel(), x.dtype).view(x.shape)
        return [x, g.ranks[src]], None

    def outputs(self, args):
        return [("tensor", args[0])]

    def torch_call(self, args, op, g):
        original("broadcast")(args[0], args[1], group=g.pg)

    def dt_call(self, args, op, g, algorithm):
        import dt

        dt.broadcast(args[0], args[1], g.pg, algorithm=algorithm)

    def target(self, case, p, rank, algorithm):
        return cost.traffic_for("broadcast", algorithm, case.size(p), self.itemsize(case), p, rank,
                                root=root(case, p))

    def payload(self, args, p):
        return args[0].numel() * args[0].element_size()


class AllToAll(Spec):
    name = "all_to_all"
    signature = "all_to_all(output_tensor_list, input_tensor_list, group=None)"
    optimal = "pairwise"
    busbw = "all_to_all"

    def make(self, case, g):
        dtype, me, m = torch_dtype(case.dtype), g.ranks[g.rank], matrix(case, g.size)
        inputs = [data(case, me, n, dtype, salt=j) for j, n in enumerate(m[g.rank])]
        outputs = [unwritten(m[i][g.rank], dtype) for i in range(g.size)]
        return [outputs, inputs], None

    def outputs(self, args):
        return [(f"output_tensor_list[{i}]", t) for i, t in enumerate(args[0])]

    def torch_call(self, args, op, g):
        out, inp = args
        flat_out = torch.empty(sum(t.numel() for t in out), dtype=inp[0].dtype)
        original("all_to_all_single")(flat_out, torch.cat([t.view(-1) for t in inp]),
                                      output_split_sizes=[t.numel() for t in out],
                                      input_split_sizes=[t.numel() for t in inp], group=g.pg)
        for t, got in zip(out, flat_out.split([t.numel() for t in out])):
            t.copy_(got)

    def dt_call(self, args, op, g, algorithm):
        import dt

        dt.all_to_all(args[0], args[1], g.pg, algorithm=algorithm)

    def target(self, case, p, rank, algorithm):
        m = matrix(case, p)
        return cost.traffic_for("all_to_all", algorithm, m[rank], self.itemsize(case), p, rank,
                                recv_numels=[m[i][rank] for i in range(p)])

    def payload(self, args, p):
        return sum(t.numel() for t in args[1]) * args[1][0].element_size()  # what one rank sends


class SyncGradients(Spec):
    """Data parallel's gradient sync: average every .grad over the group, bucket by bucket."""

    name = "sync_gradients"
    signature = "sync_gradients(params, bucket_bytes, group=None)"
    optimal = "ring"  # each bucket all-reduced by the ring
    messages_matter = True
    allow_dt = True

    def make(self, case, g):
        me = g.ranks[g.rank]
        params = []
        for i, shape in enumerate(case.params):
            p = torch.nn.Parameter(torch.zeros(shape))
            if i not in case.frozen:
                p.grad = data(case, me, p.numel(), torch.float32, salt=i).view(shape)
            params.append(p)
        return [params, case.bucket_bytes], None

    def outputs(self, args):
        return [(f"params[{i}].grad", p.grad) for i, p in enumerate(args[0]) if p.grad is not None]

    def torch_call(self, args, op, g):
        for p in args[0]:
            if p.grad is not None:
                original("all_reduce")(p.grad, op=dist.ReduceOp.AVG, group=g.pg)

    def buckets(self, case: JudgeCase) -> list[int]:
        """Elements per bucket, as dt's data parallel forms them (dt.parallel.data_parallel.make_buckets)."""
        from dt.parallel.data_parallel import make_buckets

        shaped = [torch.empty(s, device="meta") for i, s in enumerate(case.params) if i not in case.frozen]
        return [sum(shaped[i].numel() for i in b)
                for b in make_buckets(shaped, case.bucket_bytes, case.bucket_bytes)]

    def target(self, case, p, rank, algorithm):
        total = [0, 0, 0, 0, 0]
        for numel in self.buckets(case):
            t = cost.traffic_for("all_reduce", algorithm, numel, 4, p, rank)
            total = [a + b for a, b in zip(total, (t.bytes_sent, t.bytes_received, t.messages_sent,
                                                    t.messages_received, t.steps))]
        return cost.RankTraffic(*total)


SPECS: dict[str, Spec] = {s.name: s for s in (AllReduce(), ReduceScatter(), AllGather(), Broadcast(),
                                               AllToAll(), SyncGradients())}
