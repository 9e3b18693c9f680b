"""dt as a drop-in for torch.distributed: signatures, return values, dtypes, and the added collectives.

Every check compares with torch itself: inspect.signature of its functions;
and, on gloo at worlds 1, 2, 3 and 5, its results (or its refusals) for each
dtype and op, sparse all-reduce, the object collectives, coalescing and
batched point-to-point. Values are small integers, so every reduction is
exact in every dtype: a difference is a bug, not rounding.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist

import dt
from dt import cost

WORLDS = (1, 2, 3, 5)

# Every torch.distributed function dt has a twin of, by the same name.
NAMESAKES = (
    "all_gather", "all_gather_coalesced", "all_gather_into_tensor", "all_gather_object",
    "all_gather_single", "all_reduce", "all_reduce_coalesced", "all_to_all", "all_to_all_single",
    "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list", "gather", "gather_object",
    "irecv", "isend", "monitored_barrier", "recv", "recv_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send",
    "send_object_list",
)


def _shape(fn) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", NAMESAKES)
def test_signature_is_torchs_plus_keyword_only_extras(name):
    theirs = _shape(getattr(dist, name))
    ours = _shape(getattr(dt, name))
    assert ours[:len(theirs)] == theirs, f"dt.{name}{inspect.signature(getattr(dt, name))}"
    extras = ours[len(theirs):]
    assert all(kind == inspect.Parameter.KEYWORD_ONLY for _, kind, _ in extras), extras


def test_p2pop_and_work_match_torch():
    assert _shape(dt.P2POp.__init__) == _shape(dist.P2POp.__init__)
    assert issubclass(dt.Work, dist.Work)
    for method in ("wait", "is_completed", "is_success", "exception", "result", "get_future"):
        assert callable(getattr(dt.Work, method))


# ---------------------------------------------------------------------------
# Calls written as torch accepts them: positionally and by keyword.
# ---------------------------------------------------------------------------


def _calls_both_ways() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    failures = []

    def same(label, a, b):
        if not all(torch.equal(x, y) for x, y in zip(a, b)):
            failures.append(label)

    x0 = torch.arange(6.0) + r
    for how in ("positional", "keyword"):
        for mod in (dist, dt):
            x = x0.clone()
            outs = [torch.empty(6) for _ in range(p)]
            cat = torch.empty(6 * p)
            red = torch.empty(6)
            if how == "positional":
                rets = [mod.all_reduce(x, dist.ReduceOp.SUM, None, False),
                        mod.all_gather(outs, x0, None, False),
                        mod.all_gather_into_tensor(cat, x0, None, False),
                        mod.reduce_scatter_tensor(red, torch.arange(6.0 * p), dist.ReduceOp.MAX, None, False),
                        mod.broadcast(x, p - 1, None, False, None),
                        mod.barrier(None, False, None, None)]
            else:
                rets = [mod.all_reduce(tensor=x, op=dist.ReduceOp.SUM, group=None, async_op=False),
                        mod.all_gather(tensor_list=outs, tensor=x0, group=None, async_op=False),
                        mod.all_gather_into_tensor(output_tensor=cat, input_tensor=x0, group=None),
                        mod.reduce_scatter_tensor(output=red, input=torch.arange(6.0 * p),
                                                  op=dist.ReduceOp.MAX, group=None, async_op=False),
                        mod.broadcast(tensor=x, group_src=p - 1, group=None, async_op=False),
                        mod.barrier(group=None, async_op=False, device_ids=None, timeout=None)]
            if any(ret is not None for ret in rets):
                failures.append(f"{mod.__name__} {how}: a synchronous call returned {rets}")
            if mod is dist:
                ref = (x, outs, cat, red)
            else:
                same(f"{how} all_reduce/broadcast", [x], [ref[0]])
                same(f"{how} all_gather", outs, ref[1])
                same(f"{how} all_gather_into_tensor", [cat], [ref[2]])
                same(f"{how} reduce_scatter_tensor", [red], [ref[3]])
    # async: a torch Work whose future carries what gloo's does
    x = x0.clone()
    work = dt.all_reduce(x, group=None, async_op=True)
    value = work.get_future().wait()
    if not (isinstance(work, dist.Work) and work.wait() and work.is_completed() and work.is_success()):
        failures.append("async all_reduce: Work misbehaves")
    if not (isinstance(value, list) and value[0] is x and torch.equal(x, x0 * 0 + sum(
            torch.arange(6.0) + i for i in range(p)))):
        failures.append(f"async all_reduce future value {value}")
    # the future carries a failure too
    bad = dt.all_reduce(torch.ones(3, dtype=torch.int32), dist.ReduceOp.AVG, async_op=True)
    try:
        bad.get_future().wait()
        failures.append("a failed async collective's future did not raise")
    except RuntimeError as exc:
        if "AVG needs a floating dtype" not in str(exc) or bad.is_success():
            failures.append(f"future's error: {exc}")
    return failures


@pytest.mark.parametrize("world", (1, 3))
def test_calls_positional_and_by_keyword(run, world):
    for failures in run(world, _calls_both_ways):
        assert failures == []


# ---------------------------------------------------------------------------
# Every dtype and op gloo takes, complex included; refusals in torch's words.
# ---------------------------------------------------------------------------

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128)
OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def _values(case: int, rank: int, n: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(case * 7919 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_complex:
        return torch.complex(*(torch.randint(-3, 4, (n,), generator=g).double() for _ in "ri")).to(dtype)
    lo, hi = (1, 3) if op == "PRODUCT" else (0, 16) if op.startswith("B") or dtype == torch.uint8 else (-4, 5)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def _outcome(fn) -> tuple[str, object]:
    try:
        return "ok", fn()
    except (RuntimeError, ValueError) as exc:
        return "refused", str(exc)


def _reduction(name: str, mod, t: torch.Tensor, op, full: torch.Tensor) -> torch.Tensor:
    """One reducing collective through torch or dt; what the caller would look at."""
    r, p = dist.get_rank(), dist.get_world_size()
    if name == "all_reduce":
        mod.all_reduce(t, op)
        return t
    if name == "reduce":
        mod.reduce(t, p - 1, op)
        return t if r == p - 1 else t[:0]  # elsewhere torch leaves it undefined
    out = torch.empty(full.numel() // p, dtype=full.dtype)
    mod.reduce_scatter_tensor(out, full, op)
    return out


def _same_result(a: torch.Tensor, b: torch.Tensor, op: str) -> bool:
    if op == "AVG" and a.is_complex():  # torch divides as complex numbers, dt each real: last bit
        return torch.allclose(a, b, rtol=1e-6, atol=0)
    return torch.equal(a, b)


def _dtype_cases() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    failures = []
    case = 0
    for dtype in DTYPES:
        for op in OPS:
            rop = getattr(dist.ReduceOp, op)
            case += 1
            x = _values(case, r, 7, dtype, op)
            full = torch.cat([_values(case, r, 3, dtype, op) for _ in range(p)])
            for name in ("all_reduce", "reduce", "reduce_scatter_tensor"):
                theirs = _outcome(lambda m=dist: _reduction(name, m, x.clone(), rop, full))  # noqa: B023
                ours = _outcome(lambda m=dt: _reduction(name, m, x.clone(), rop, full))  # noqa: B023
                label = f"{name} {dtype} {op}"
                if theirs[0] != ours[0]:
                    failures.append(f"{label}: torch {theirs}, dt {ours}")
                elif theirs[0] == "ok" and not _same_result(theirs[1], ours[1], op):
                    failures.append(f"{label}: torch {theirs[1]}, dt {ours[1]}")
                elif theirs[0] == "refused" and dtype.is_complex:
                    if f"does not support RedOpType.{op} on complex tensors" not in ours[1]:
                        failures.append(f"{label}: dt's refusal {ours[1]!r} is not torch's")
                elif theirs[0] == "refused" and "non-integral" in theirs[1] and theirs[1] not in ours[1]:
                    failures.append(f"{label}: dt's refusal {ours[1]!r} is not torch's {theirs[1]!r}")
    # complex data through the collectives that only move it
    z = _values(1, r, 5, torch.complex64, "SUM")
    for label, call in (
        ("broadcast", lambda m: m.broadcast(t := z.clone(), 0) or [t]),
        ("all_gather", lambda m: m.all_gather(o := [torch.empty_like(z) for _ in range(p)], z) or o),
        ("all_to_all_single", lambda m: m.all_to_all_single(o := torch.empty(2 * p, dtype=z.dtype),
                                                            torch.arange(2 * p) * (1j + r)) or [o]),
        ("scatter", lambda m: m.scatter(o := torch.empty_like(z),
                                        [z * i for i in range(p)] if r == 0 else None, 0) or [o]),
    ):
        if not all(torch.equal(a, b) for a, b in zip(call(dist), call(dt))):
            failures.append(f"complex {label}")
    return failures


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", WORLDS)
def test_dtypes_and_ops_match_torch(run, world):
    for failures in run(world, _dtype_cases, timeout=200):
        assert failures == []


# ---------------------------------------------------------------------------
# Sparse COO all-reduce, against gloo's.
# ---------------------------------------------------------------------------


def _sparse(case: int, rank: int, shape: tuple, sparse_dim: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(case * 31 + rank)
    nnz = (case + 2 * rank) % 5  # some ranks hold nothing at all
    idx = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g) for d in range(sparse_dim)])
    vals = torch.randint(-3, 4, (nnz, *shape[sparse_dim:]), generator=g).to(dtype)
    return torch.sparse_coo_tensor(idx, vals, shape)  # duplicates left in: not coalesced


def _sparse_cases() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    failures = []
    for case, (shape, sparse_dim, dtype) in enumerate(
            [((6, 5), 2, torch.float32), ((4, 3), 1, torch.float64), ((7,), 1, torch.int64),
             ((3, 4, 2), 2, torch.float32)]):
        ref, mine = _sparse(case, r, shape, sparse_dim, dtype), _sparse(case, r, shape, sparse_dim, dtype)
        dist.all_reduce(ref)
        work = dt.all_reduce(mine, async_op=True)
        work.wait()
        ref, mine = ref.coalesce(), mine.coalesce()
        if not (torch.equal(ref.indices(), mine.indices()) and torch.equal(ref.values(), mine.values())
                and mine.shape == ref.shape):
            failures.append(f"sparse {shape} sparse_dim={sparse_dim} {dtype}")
    refused = _outcome(lambda: dt.all_reduce(_sparse(9, r, (4, 4), 2, torch.float32), dist.ReduceOp.MAX))
    if refused[0] != "refused" or "only works with ReduceOp.SUM" not in refused[1]:
        failures.append(f"sparse MAX: {refused}")
    # What it moved is what dt.cost says: a Bruck all-gather of the headers, two ring all-gathers.
    dt.set_validation(False)
    t = _sparse(11, r, (5, 6), 1, torch.float32).coalesce()
    counts = [_sparse(11, i, (5, 6), 1, torch.float32).coalesce().indices().shape[1] for i in range(p)]
    with dt.traffic() as measured:
        dt.all_reduce(t)
    model = [cost.bruck_all_gather(2, 8, p), cost.ring_all_gather(counts, 8, r),
             cost.ring_all_gather([6 * c for c in counts], 4, r)]
    if measured.bytes_sent != sum(m.bytes_sent for m in model) or \
            measured.messages_received != sum(m.messages_received for m in model):
        failures.append(f"sparse traffic {measured.bytes_sent} vs model {model}")
    return failures


@pytest.mark.parametrize("world", WORLDS)
def test_sparse_all_reduce_matches_gloo(run, world):
    for failures in run(world, _sparse_cases):
        assert failures == []


# ---------------------------------------------------------------------------
# Objects, coalescing, batched point-to-point, monitored barrier.
# ---------------------------------------------------------------------------


def _obj(rank: int) -> object:
    return {"rank": rank, "payload": list(range(rank * 7)), "name": "x" * (3 * rank + 1)}


def _added_collective_cases() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    failures = []

    def check(label, a, b):
        if a != b:
            failures.append(f"{label}: torch {a!r:.120} dt {b!r:.120}")

    theirs, ours = [None] * p, [None] * p
    dist.all_gather_object(theirs, _obj(r))
    dt.all_gather_object(ours, _obj(r))
    check("all_gather_object", theirs, ours)
    for src in sorted({0, p - 1}):
        lists = [[_obj(r), r] if r == src else [None, None] for _ in range(2)]
        dist.broadcast_object_list(lists[0], src=src)
        dt.broadcast_object_list(lists[1], src=src)
        check(f"broadcast_object_list src={src}", *lists)
        outs = [[None] * p if r == src else None for _ in range(2)]
        dist.gather_object(_obj(r), outs[0], dst=src)
        dt.gather_object(_obj(r), outs[1], dst=src)
        check(f"gather_object dst={src}", *outs)
        outs = [[None], [None]]
        inputs = [_obj(10 + i) for i in range(p)] if r == src else None
        dist.scatter_object_list(outs[0], inputs, src=src)
        dt.scatter_object_list(outs[1], inputs, group_src=src)
        check(f"scatter_object_list src={src}", *outs)
    if p > 1:  # rank 0 sends rank p-1 two objects
        got = [[None, None], [None, None]]
        for mod, box in ((dist, got[0]), (dt, got[1])):
            if r == 0:
                mod.send_object_list([_obj(3), "two"], dst=p - 1)
            elif r == p - 1:
                if mod.recv_object_list(box, src=0) != 0:
                    failures.append(f"{mod.__name__}.recv_object_list did not return the sender")
        check("send/recv_object_list", *got)
    # coalescing: mixed shapes, complex included; async hands back a Future, as torch's
    base = [torch.arange(5.0) + r, torch.ones(2, 3) * r, torch.tensor([1 + 2j, r * 1j])]
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        a, b = [t.clone() for t in base], [t.clone() for t in base]
        dist.all_reduce_coalesced(a, op)
        fut = dt.all_reduce_coalesced(b, op, async_op=True)
        if not isinstance(fut, torch.Future) or fut.wait()[0] is not b[0]:  # the type gloo's have
            failures.append("all_reduce_coalesced async does not return torch's Future")
        check(f"all_reduce_coalesced {op}", [t.tolist() for t in a], [t.tolist() for t in b])
    ins = [torch.arange(3.0) * r, torch.ones(2, 2) * (r + 1)]
    outs = [[[torch.empty(3), torch.empty(2, 2)] for _ in range(p)] for _ in range(2)]
    dist.all_gather_coalesced(outs[0], ins)
    dt.all_gather_coalesced(outs[1], ins)
    check("all_gather_coalesced", *[[[t.tolist() for t in row] for row in o] for o in outs])
    # batched point-to-point: a ring both ways, with dt's P2POp and with torch's
    # (not at world 1: gloo, torch's as dt's wire, cannot send a rank to itself)
    for make in (dt.P2POp, dist.P2POp) if p > 1 else ():
        send = torch.arange(4.0) + 10 * r
        left, right = torch.empty(4), torch.empty(4)
        irecv, isend = (dist.irecv, dist.isend) if make is dist.P2POp else (dt.irecv, dt.isend)
        ops = [make(isend, send, (r + 1) % p), make(isend, send, (r - 1) % p),
               make(irecv, left, (r - 1) % p), make(irecv, right, (r + 1) % p)]
        works = dt.batch_isend_irecv(ops)
        if not all(w.wait() for w in works) or not all(w.is_completed() for w in works):
            failures.append("batch_isend_irecv works")
        expected = (torch.arange(4.0) + 10 * ((r - 1) % p), torch.arange(4.0) + 10 * ((r + 1) % p))
        if not (torch.equal(left, expected[0]) and torch.equal(right, expected[1])):
            failures.append(f"batch_isend_irecv with {make.__module__}.P2POp")
    dist.monitored_barrier()
    dt.monitored_barrier(wait_all_ranks=True)
    # What they move is what their docstrings say (dt.cost for the collective inside).
    with dt.traffic() as t:
        dt.all_reduce_coalesced([torch.ones(5), torch.ones(2, 3)], algorithm="naive")
        dt.monitored_barrier()
    coalesced, monitored = t.by_collective["all_reduce"], t.by_collective["monitored_barrier"]
    model = cost.naive_all_reduce(11, 4, p, r)
    if (coalesced.bytes_sent, coalesced.bytes_received) != (model.bytes_sent, model.bytes_received):
        failures.append(f"all_reduce_coalesced moved {coalesced} for {model}")
    tokens = (p - 1 if r == 0 else 1) if p > 1 else 0  # one byte each way, every one through rank 0
    if (monitored.bytes_sent, monitored.bytes_received, monitored.messages_sent) != (tokens,) * 3:
        failures.append(f"monitored_barrier moved {monitored}")
    return failures


@pytest.mark.parametrize("world", WORLDS)
def test_added_collectives_match_torch(run, world):
    for failures in run(world, _added_collective_cases):
        assert failures == []


def _monitored_barrier_names_missing_ranks(wait_all: bool) -> tuple[str, str] | None:
    """Ranks 2, 3, 4 never arrive (on a throwaway group: their absence leaves it unusable)."""
    import datetime

    group, pair = dist.new_group(), dist.new_group([0, 1])
    r = dist.get_rank()
    if r >= 2:
        return None
    dt.barrier(group=pair)  # ranks 0 and 1 arrive together, however loaded the machine
    try:
        dt.monitored_barrier(group, timeout=datetime.timedelta(seconds=1.5), wait_all_ranks=wait_all)
    except dt.CollectiveError as exc:
        return type(exc).__name__, str(exc)
    return "returned", ""


@pytest.mark.parametrize("wait_all", (False, True))
def test_monitored_barrier_names_the_ranks_that_did_not_arrive(run, wait_all):
    root, other = run(5, _monitored_barrier_names_missing_ranks, wait_all)[:2]
    assert root[0] == "CollectiveTimeout", root
    named = "[2, 3, 4]" if wait_all else "[2]"
    assert f"rank(s) {named} failed to pass monitoredBarrier" in root[1], root
    assert other[0] == "CollectiveTimeout" and "from rank 0" in other[1]  # never released


def _added_collectives_without_torch_collectives() -> int:
    """Make every torch collective raise (point-to-point, dt's wire, stays), then run dt's new ones."""
    r, p = dist.get_rank(), dist.get_world_size()
    forbidden = [n for n in NAMESAKES if n not in ("isend", "irecv", "send", "recv")]
    forbidden += ["all_gather_single", "reduce_scatter_single", "reduce_scatter_tensor"]
    saved = {name: getattr(dist, name) for name in forbidden}

    def refuse(*args, **kwargs):
        raise AssertionError("a torch.distributed collective was called inside dt")

    for name in forbidden:
        setattr(dist, name, refuse)
    try:
        dt.all_gather_object([None] * p, r)
        dt.broadcast_object_list([r], src=0)
        dt.gather_object(r, [None] * p if r == 0 else None, dst=0)
        dt.scatter_object_list([None], list(range(p)) if r == 0 else None, src=0)
        dt.all_reduce_coalesced([torch.ones(2), torch.ones(3)])
        dt.all_gather_coalesced([[torch.empty(2)] for _ in range(p)], [torch.ones(2)])
        dt.all_reduce(torch.sparse_coo_tensor(torch.tensor([[r % 2]]), torch.ones(1), (2,)))
        dt.all_reduce(torch.ones(2, dtype=torch.complex64))
        dt.monitored_barrier()
        works = dt.batch_isend_irecv([dt.P2POp(dt.isend, torch.ones(1), (r + 1) % p),
                                      dt.P2POp(dt.irecv, torch.empty(1), (r - 1) % p)])
        for w in works:
            w.wait()
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
    return len(works)


def test_no_torch_collective_inside_the_added_ones(run):
    assert run(3, _added_collectives_without_torch_collectives) == [2, 2, 2]
