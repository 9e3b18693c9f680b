"""Tensor parallel layers against their unsharded twins, at group sizes 1 to 5.

Each layer is built right after torch.manual_seed(s), as is its reference
(torch.nn.Linear / nn.Embedding / MLP and SelfAttention of tests/twins.py), so the shards
must be exact slices of the reference's parameters. Forward outputs, input
gradients and every parameter gradient are compared slice by slice on every
rank. One worker call per group size runs all the checks (fast on 2 cores).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import dt
from dt import cost
from dt.parallel import tensor as tp
from dt.transport import resolve_group
from tests.twins import MLP, SelfAttention

F64 = torch.float64
TOL64 = 1e-9  # float64; the brief asks for 1e-5
TOL32 = 1e-4


class _Errors:
    """Largest absolute difference seen per check name."""

    def __init__(self) -> None:
        self.worst: dict[str, float] = {}

    def __call__(self, name: str, got: torch.Tensor | None, want: torch.Tensor | None) -> None:
        if got is None or want is None:
            assert got is None and want is None, f"{name}: one of got/want is None"
            err = 0.0
        else:
            assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
            err = (got.detach() - want.detach()).abs().max().item() if got.numel() else 0.0
        self.worst[name] = max(self.worst.get(name, 0.0), err)


def _randn(*shape: int, seed: int, dtype: torch.dtype = F64) -> torch.Tensor:
    """The same tensor on every rank."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def _sl(size: int, group=None) -> slice:
    start, stop = tp.shard_range(size, group)
    return slice(start, stop)


# ----------------------------------------------------------------------------
# The checks, run on every rank of the pool.
# ----------------------------------------------------------------------------


def _check_column(err: _Errors, group=None) -> None:
    for in_f, out_f in ((7, 33), (5, 3), (4, 1)):  # 33 uneven; 3 and 1 fewer than the ranks
        for bias, gather in ((True, False), (False, True)):
            tag = f"column {in_f}->{out_f} bias={bias} gather={gather}"
            torch.manual_seed(11)
            ref = nn.Linear(in_f, out_f, bias=bias, dtype=F64)
            torch.manual_seed(11)
            layer = tp.ColumnParallelLinear(in_f, out_f, bias=bias, gather_output=gather,
                                            group=group, dtype=F64)
            x, grad_y = _randn(2, 3, in_f, seed=1), _randn(2, 3, out_f, seed=2)
            xr, xp = _leaf(x), _leaf(x)
            ref(xr).backward(grad_y)
            cols = _sl(out_f, group)
            y = layer(xp)
            if gather:
                err(f"{tag}: output", y, ref(x))
                y.backward(grad_y)
            else:
                err(f"{tag}: output", y, ref(x)[..., cols])
                y.backward(grad_y[..., cols])
            err(f"{tag}: grad input", xp.grad, xr.grad)
            err(f"{tag}: grad weight", layer.weight.grad, ref.weight.grad[cols])
            err(f"{tag}: grad bias", layer.bias.grad if bias else None,
                ref.bias.grad[cols] if bias else None)
            err(f"{tag}: full_weight", layer.full_weight(), ref.weight)
            err(f"{tag}: full_bias", layer.full_bias(), ref.bias if bias else None)


def _check_row(err: _Errors, group=None) -> None:
    for in_f, out_f in ((33, 5), (3, 4), (1, 2)):
        for bias, parallel_input in ((True, True), (False, False), (True, False)):
            tag = f"row {in_f}->{out_f} bias={bias} input_is_parallel={parallel_input}"
            torch.manual_seed(12)
            ref = nn.Linear(in_f, out_f, bias=bias, dtype=F64)
            torch.manual_seed(12)
            layer = tp.RowParallelLinear(in_f, out_f, bias=bias, input_is_parallel=parallel_input,
                                         group=group, dtype=F64)
            x, grad_y = _randn(2, 3, in_f, seed=3), _randn(2, 3, out_f, seed=4)
            xr = _leaf(x)
            ref(xr).backward(grad_y)
            rows = _sl(in_f, group)
            xp = _leaf(x[..., rows] if parallel_input else x)
            y = layer(xp)
            y.backward(grad_y)
            err(f"{tag}: output", y, ref(x))
            err(f"{tag}: grad input", xp.grad, xr.grad[..., rows] if parallel_input else xr.grad)
            err(f"{tag}: grad weight", layer.weight.grad, ref.weight.grad[:, rows])
            err(f"{tag}: grad bias", layer.bias.grad if bias else None,
                ref.bias.grad if bias else None)
            err(f"{tag}: full_weight", layer.full_weight(), ref.weight)
            if bias:  # a zero input leaves the bias alone: added once, not p times
                zero = torch.zeros(1, in_f, dtype=F64)
                err(f"{tag}: bias once", layer(zero[..., rows] if parallel_input else zero),
                    ref.bias.detach().unsqueeze(0))


def _param_reference(name: str, ref_grad: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """The slice of a reference gradient that parameter `name` of a sharded module holds."""
    owner = name.rsplit(".", 1)[0] if "." in name else ""
    layer = module.get_submodule(owner)
    if isinstance(layer, tp.ColumnParallelLinear):
        return ref_grad[_sl(layer.out_features, layer.group)]
    if isinstance(layer, tp.RowParallelLinear) and name.endswith("weight"):
        return ref_grad[:, _sl(layer.in_features, layer.group)]
    return ref_grad  # row bias, layer norms: replicated


def _compare_grads(err: _Errors, tag: str, ref: nn.Module, par: nn.Module, prefix: str = "") -> None:
    ref_params = dict(ref.named_parameters())
    par_params = dict(par.named_parameters())
    assert set(ref_params) == set(par_params), (sorted(ref_params), sorted(par_params))
    for name, p in par_params.items():
        err(f"{tag}: grad {name}", p.grad, _param_reference(name, ref_params[name].grad, par))


def _check_mlp(err: _Errors, group=None, dtype: torch.dtype = F64) -> None:
    hidden, ffn = 8, 33
    tag = f"mlp {dtype}"
    torch.manual_seed(13)
    ref = MLP(hidden, ffn, dtype=dtype)
    torch.manual_seed(13)
    par = tp.ParallelMLP(hidden, ffn, group, dtype=dtype)
    x, grad_y = _randn(2, 5, hidden, seed=5, dtype=dtype), _randn(2, 5, hidden, seed=6, dtype=dtype)
    xr, xp = _leaf(x), _leaf(x)
    yr, yp = ref(xr), par(xp)
    yr.backward(grad_y)
    yp.backward(grad_y)
    err(f"{tag}: output", yp, yr)
    err(f"{tag}: grad input", xp.grad, xr.grad)
    _compare_grads(err, tag, ref, par)


def _check_attention(err: _Errors, group=None) -> None:
    heads, head_dim = 60, 2  # 60 heads divide every group size 1..5
    hidden = heads * head_dim
    for causal in (True, False):
        tag = f"attention causal={causal}"
        torch.manual_seed(14)
        ref = SelfAttention(hidden, heads, causal=causal, dtype=F64)
        torch.manual_seed(14)
        par = tp.ParallelSelfAttention(hidden, heads, group, causal=causal, dtype=F64)
        x, grad_y = _randn(2, 5, hidden, seed=7), _randn(2, 5, hidden, seed=8)
        xr, xp = _leaf(x), _leaf(x)
        yr, yp = ref(xr), par(xp)
        yr.backward(grad_y)
        yp.backward(grad_y)
        err(f"{tag}: output", yp, yr)
        err(f"{tag}: grad input", xp.grad, xr.grad)
        _compare_grads(err, tag, ref, par)


def _check_embedding(err: _Errors, group=None) -> None:
    for vocab in (33, 3):
        tag = f"embedding vocab={vocab}"
        torch.manual_seed(15)
        ref = nn.Embedding(vocab, 4, dtype=F64)
        torch.manual_seed(15)
        par = tp.VocabParallelEmbedding(vocab, 4, group, dtype=F64)
        ids = torch.randint(0, vocab, (3, 7), generator=torch.Generator().manual_seed(9))
        grad_y = _randn(3, 7, 4, seed=10)
        yr, yp = ref(ids), par(ids)
        yr.backward(grad_y)
        yp.backward(grad_y)
        err(f"{tag}: output", yp, yr)
        err(f"{tag}: grad weight", par.weight.grad, ref.weight.grad[_sl(vocab, group)])
        err(f"{tag}: full_weight", par.full_weight(), ref.weight)


def _check_cross_entropy(err: _Errors, group=None) -> None:
    for vocab, scale in ((33, 1.0), (33, 100.0), (3, 1.0)):  # x100: exp would overflow unshifted
        tag = f"cross-entropy vocab={vocab} scale={scale}"
        logits = _randn(2, 5, vocab, seed=11) * scale
        target = torch.randint(0, vocab, (2, 5), generator=torch.Generator().manual_seed(12))
        weights = _randn(2, 5, seed=13)  # a non-uniform upstream gradient
        zr = _leaf(logits)
        lr = F.cross_entropy(zr.reshape(-1, vocab), target.reshape(-1), reduction="none").view(2, 5)
        (lr * weights).sum().backward()
        zp = _leaf(logits[..., _sl(vocab, group)])
        lp = tp.vocab_parallel_cross_entropy(zp, target, group, vocab_size=vocab)
        (lp * weights).sum().backward()
        err(f"{tag}: loss", lp, lr)
        err(f"{tag}: grad logits", zp.grad, zr.grad[..., _sl(vocab, group)])


def _check_tied_head(err: _Errors, group=None) -> None:
    """Embedding -> tanh -> the same table as output head -> cross-entropy, logits never gathered."""
    vocab, dim = 33, 6
    for sp in (False, True):
        tag = f"tied head sequence_parallel={sp}"
        torch.manual_seed(17)
        ref = nn.Embedding(vocab, dim, dtype=F64)
        torch.manual_seed(17)
        par = tp.VocabParallelEmbedding(vocab, dim, group, dtype=F64)
        ids = torch.randint(0, vocab, (2, 5), generator=torch.Generator().manual_seed(18))
        target = torch.randint(0, vocab, (2, 5), generator=torch.Generator().manual_seed(19))
        logits = torch.tanh(ref(ids)) @ ref.weight.T
        lr = F.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))
        lr.backward()
        h = torch.tanh(par(ids))
        if sp:  # the head's input arrives sequence sharded; its logits cover every token
            h = tp.scatter_to_sequence_region(h, group)
        local = tp.parallel_lm_logits(h, par.weight, group, sequence_parallel=sp, seq_len=5)
        lp = tp.vocab_parallel_cross_entropy(local, target, group, vocab_size=vocab).mean()
        lp.backward()
        err(f"{tag}: loss", lp, lr)
        err(f"{tag}: grad weight", par.weight.grad, ref.weight.grad[_sl(vocab, group)])


def _check_sequence_parallel(err: _Errors, group=None) -> None:
    """LayerNorm -> MLP -> residual -> LayerNorm -> attention -> residual, sequence sharded."""
    heads, hidden, seq = 60, 120, 7  # 7 tokens: uneven over 2..5 ranks
    torch.manual_seed(16)
    ln1, mlp = nn.LayerNorm(hidden, dtype=F64), MLP(hidden, 33, dtype=F64)
    ln2, attn = nn.LayerNorm(hidden, dtype=F64), SelfAttention(hidden, heads, dtype=F64)
    torch.manual_seed(16)
    pln1 = tp.SequenceParallelLayerNorm(hidden, group=group, dtype=F64)
    pmlp = tp.ParallelMLP(hidden, 33, group, sequence_parallel=True, dtype=F64)
    pln2 = tp.SequenceParallelLayerNorm(hidden, group=group, dtype=F64)
    pattn = tp.ParallelSelfAttention(hidden, heads, group, sequence_parallel=True,
                                      dtype=F64)
    with torch.no_grad():  # non-trivial layer norm parameters, the same on both sides
        for i, (a, b) in enumerate(((ln1, pln1), (ln2, pln2))):
            a.weight.copy_(1 + 0.1 * _randn(hidden, seed=20 + i))
            a.bias.copy_(0.1 * _randn(hidden, seed=30 + i))
            b.weight.copy_(a.weight)
            b.bias.copy_(a.bias)
    x, grad_y = _randn(2, seq, hidden, seed=14), _randn(2, seq, hidden, seed=15)

    xr = _leaf(x)
    hr = xr + mlp(ln1(xr))
    yr = hr + attn(ln2(hr))
    yr.backward(grad_y)

    xp = _leaf(x)
    xs = tp.scatter_to_sequence_region(xp, group)  # [2, this rank's tokens, hidden]
    hs = xs + pmlp(pln1(xs), seq_len=seq)
    ys = hs + pattn(pln2(hs), seq_len=seq)
    yp = tp.gather_from_sequence_region(ys, group, seq_len=seq,
                                        tensor_parallel_output_grad=False)
    yp.backward(grad_y)

    tag = "sequence parallel"
    err(f"{tag}: shard", ys, yr[:, _sl(seq, group)])
    err(f"{tag}: output", yp, yr)
    err(f"{tag}: grad input", xp.grad, xr.grad)
    for (ra, pa, name) in ((ln1, pln1, "ln1"), (mlp, pmlp, "mlp"), (ln2, pln2, "ln2"),
                           (attn, pattn, "attention")):
        _compare_grads(err, f"{tag} {name}", ra, pa)


def _check_conjugates(err: _Errors, group=None) -> None:
    """The four region functions alone, uneven sizes: forward and backward by hand."""
    g = resolve_group(group)
    p, r = g.size, g.rank
    full = 11
    x = _randn(3, full, seed=40) + r  # differs per rank: reductions are visible
    everyone = sum(_randn(3, full, seed=40) + i for i in range(p))
    grad = _randn(3, full, seed=41) * (r + 1)
    grad_sum = sum(_randn(3, full, seed=41) * (i + 1) for i in range(p))
    cols = _sl(full, group)

    a = _leaf(x)
    y = tp.copy_to_region(a, group)
    y.backward(grad)
    err("f: forward identity", y, x)
    err("f: backward all-reduce", a.grad, grad_sum)

    a = _leaf(x)
    y = tp.reduce_from_region(a, group)
    y.backward(grad)
    err("g: forward all-reduce", y, everyone)
    err("g: backward identity", a.grad, grad)

    a = _leaf(x)
    y = tp.scatter_to_region(a, group)
    y.backward(grad[:, cols])
    err("scatter: forward split", y, x[:, cols])
    want = torch.cat([(_randn(3, full, seed=41) * (i + 1))[:, slice(*_range(full, p, i))]
                      for i in range(p)], dim=1)
    err("scatter: backward all-gather", a.grad, want)

    a = _leaf(x[:, cols])
    y = tp.gather_from_region(a, group, full_size=full)
    y.backward(grad)
    want = torch.cat([(_randn(3, full, seed=40) + i)[:, slice(*_range(full, p, i))] for i in range(p)],
                     dim=1)
    err("gather: forward all-gather", y, want)
    err("gather: backward split", a.grad, grad[:, cols])

    a = _leaf(x)  # reduce-scatter along dim 1 (the sequence of a [b, s] tensor)
    y = tp.reduce_scatter_to_sequence_region(a, group)
    y.backward(grad[:, cols])
    err("reduce-scatter: forward", y, everyone[:, cols])
    err("reduce-scatter: backward all-gather", a.grad, torch.cat(
        [(_randn(3, full, seed=41) * (i + 1))[:, slice(*_range(full, p, i))] for i in range(p)], 1))

    a = _leaf(x[:, cols])
    y = tp.gather_from_sequence_region(a, group, seq_len=full)
    y.backward(grad)
    err("sequence gather: backward reduce-scatter", a.grad, grad_sum[:, cols])


def _range(size: int, p: int, i: int) -> tuple[int, int]:
    sizes = cost.split_sizes(size, p)
    return sum(sizes[:i]), sum(sizes[: i + 1])


def _all_checks(group=None) -> tuple[dict[str, float], dict[str, float]]:
    err64, err32 = _Errors(), _Errors()
    _check_conjugates(err64, group)
    _check_column(err64, group)
    _check_row(err64, group)
    _check_mlp(err64, group)
    _check_mlp(err32, group, torch.float32)
    _check_attention(err64, group)
    _check_embedding(err64, group)
    _check_cross_entropy(err64, group)
    _check_tied_head(err64, group)
    _check_sequence_parallel(err64, group)
    return err64.worst, err32.worst


def _subgroup_checks(layout: list[list[int]]) -> tuple[dict[str, float], dict[str, float]]:
    """All checks on this rank's tensor-parallel subgroup, every subgroup at once."""
    mine = None
    for ranks in layout:  # every rank creates every group, in the same order
        pg = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = pg
    worst64, worst32 = _all_checks(mine)
    # a module holding a subgroup survives copy.deepcopy (and shares the group)
    torch.manual_seed(3)
    mlp = tp.ParallelMLP(8, 33, mine, dtype=F64)
    twin = copy.deepcopy(mlp)
    x = _randn(2, 3, 8, seed=3)
    worst64["deepcopy"] = (twin(x) - mlp(x)).abs().max().item()
    return worst64, worst32


def _assert_close(results: list, what: str) -> None:
    for rank, (worst64, worst32) in enumerate(results):
        bad = {k: v for k, v in worst64.items() if not v <= TOL64}
        bad.update({k: v for k, v in worst32.items() if not v <= TOL32})
        assert not bad, f"{what}, rank {rank}: {bad}"
        assert len(worst64) > 100 and len(worst32) > 5  # every check ran


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_layers_match_unsharded_reference(run, world):
    _assert_close(run(world, _all_checks), f"tensor-parallel size {world}")


@pytest.mark.parametrize("layout", [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0], [1, 2, 3]]],
                         ids=["blocks", "strided", "1+3"])
def test_layers_on_subgroups(run, layout):
    """Tensor parallelism inside a larger world (as on a mesh): groups run side by side."""
    _assert_close(run(4, _subgroup_checks, layout), f"groups {layout}")


# ----------------------------------------------------------------------------
# Errors, and bytes against the cost model.
# ----------------------------------------------------------------------------


def _bad_heads() -> list[str]:
    messages = []
    for heads, hidden in ((7, 14), (3, 12)):
        try:
            tp.ParallelSelfAttention(hidden, heads)
            messages.append("")
        except ValueError as exc:
            messages.append(str(exc))
    try:
        tp.ParallelSelfAttention(10, 3)  # hidden not a multiple of the heads
        messages.append("")
    except ValueError as exc:
        messages.append(str(exc))
    return messages


@pytest.mark.parametrize("world", [2, 4])
def test_heads_not_divisible_by_group_rejected(run, world):
    for messages in run(world, _bad_heads):
        assert "num_heads 7 is not divisible by the tensor-parallel group size" in messages[0]
        if world == 2:
            assert "num_heads 3 is not divisible" in messages[1]
        else:
            assert "num_heads 3" in messages[1]
        assert "hidden size 10 is not divisible by num_heads 3" in messages[2]


def _mlp_traffic(shape: tuple[int, int, int], sequence_parallel: bool, force: str = "") -> dict:
    """Bytes and calls of one ParallelMLP forward + backward, counted and predicted."""
    g = resolve_group(None)
    b, s, h = shape
    torch.manual_seed(0)
    mlp = tp.ParallelMLP(h, 2 * h, sequence_parallel=sequence_parallel, dtype=F64)
    x = _leaf(_randn(b, s, h, seed=1))
    inp = tp.scatter_to_sequence_region(x).detach().requires_grad_() if sequence_parallel else x
    before = os.environ.get("DT_ALGO")
    os.environ["DT_ALGO"] = force  # "" = let auto choose
    try:
        with dt.traffic() as t:
            out = mlp(inp, seq_len=s)
            out.backward(torch.ones_like(out))
    finally:
        if before is None:
            del os.environ["DT_ALGO"]
        else:
            os.environ["DT_ALGO"] = before
    item = 8
    if sequence_parallel:
        shards = [n * b * h for n in cost.split_sizes(s, g.size)]  # [s, b, h] blocks
        want = {"all_gather": 2 * tp.collective_bytes("all_gather", shards, item, algorithm=force or "auto"),
                "reduce_scatter": 2 * tp.collective_bytes("reduce_scatter", shards, item,
                                                          algorithm=force or "auto"),
                "all_reduce": tp.all_reduce_bytes(h, item, algorithm=force or "auto")}  # bias grad
    else:
        want = {"all_reduce": 2 * tp.all_reduce_bytes(b * s * h, item, algorithm=force or "auto")}
    ignore = ("validate",)
    return {"counted": {k: v.bytes_sent for k, v in t.by_collective.items()
                        if k not in ignore and v.bytes_sent},
            "want": {k: v for k, v in want.items() if v},
            "calls": {k: v.calls for k, v in t.by_collective.items() if k not in ignore and v.calls},
            # one int is every rank's shard: the same as the list of equal shards
            "equal_shards": [tp.collective_bytes(c, 6, item, algorithm=force or "auto")
                             == tp.collective_bytes(c, [6] * g.size, item, algorithm=force or "auto")
                             for c in ("all_gather", "reduce_scatter")]}


@pytest.mark.parametrize("world", [1, 3, 4])
def test_mlp_traffic_matches_cost_model(run, world):
    """One MLP forward + backward: exactly the bytes dt.cost predicts, on every rank."""
    small, large = (2, 4, 16), (2, 48, 128)  # 1 KiB and 96 KiB of float64 activations
    for shape in (small, large):
        for sp in (False, True):
            for res in run(world, _mlp_traffic, shape, sp):
                assert res["counted"] == res["want"], (shape, sp, res)
                assert res["equal_shards"] == [True, True]
                if world > 1:  # g forward, f backward; sequence parallel: their two halves each
                    want_calls = ({"all_gather": 2, "reduce_scatter": 2, "all_reduce": 1} if sp
                                  else {"all_reduce": 2})
                    assert res["calls"] == want_calls, (shape, sp, res)
    # the ring by name: 2(p-1)/p * n per all-reduce, one forward (g) and one backward (f)
    n = 2 * 48 * 128 * 8
    for res in run(world, _mlp_traffic, large, False, "ring"):
        assert res["counted"] == res["want"] == ({"all_reduce": 2 * (2 * (world - 1) * n // world)}
                                                 if world > 1 else {})


def _misuse() -> list[str]:
    """Mistakes that must fail with a clear message on every rank, not hang."""
    messages = []
    x = _randn(2, 7, 4, seed=0)
    attempts = [
        # 7 tokens over 3 ranks are 3, 2, 2: gathering them needs seq_len
        lambda: tp.gather_from_sequence_region(tp.scatter_to_sequence_region(x)),
        # logits shards of 4 cannot be split_sizes(9, 3) = 3, 3, 3
        lambda: tp.vocab_parallel_cross_entropy(_randn(3, 4, seed=1), torch.zeros(3, dtype=torch.long),
                                                vocab_size=9),
        lambda: tp.scatter_to_region(x, sizes=[1, 1, 1]),
    ]
    for attempt in attempts:
        try:
            attempt()
            messages.append("")
        except (ValueError, dt.CollectiveError) as exc:
            messages.append(str(exc))
    return messages


def test_misuse_fails_clearly(run):
    for messages in run(3, _misuse):
        assert "all_gather" in messages[0] and "disagree" in messages[0]
        assert "holds a shard of 4 but the shard sizes are [3, 3, 3]" in messages[1]
        assert "must be 3 numbers summing to 4" in messages[2]
