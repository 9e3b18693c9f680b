"""NCCL's rules over every parallel mode: DDP, ZeRO 1-3, FSDP, tensor parallel, the
pipeline schedules and dt train's step (its plans, experts, context parallel), each run
as it would post on NCCL (dt.transport.rules) and replayed on in-order streams. Each mode's result under
the rules is also compared with the same code run the ordinary (gloo) way, so
the NCCL posting path is checked for correctness too.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dt.transport import rules


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 12), nn.GELU(), nn.Linear(12, 5))


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(6, 12, generator=g), torch.randn(6, 5, generator=g)


def _data_parallel_step(mode: str) -> list[float]:
    """Two steps of `mode` on this rank's batch; the parameters after them."""
    import torch.distributed as dist

    from dt.parallel.data_parallel import DistributedDataParallel
    from dt.parallel.zero import FullyShardedDataParallel, ZeroOptimizer

    model = _mlp()
    x, y = _batch(dist.get_rank())
    if mode == "ddp":
        net = DistributedDataParallel(model, bucket_cap_mb=0.0005, first_bucket_mb=0.0002)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
    elif mode == "fsdp":
        net = FullyShardedDataParallel(model)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
    else:
        net = model
        opt = ZeroOptimizer(model.parameters(), torch.optim.Adam, stage=int(mode[-1]), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    if mode == "fsdp":
        return [float(v.sum()) for v in net.state_dict().values()]
    return [float(p.sum()) for p in model.parameters()]


def _tensor_parallel_step() -> list[float]:
    import dt
    from dt.parallel import tensor as tp

    torch.manual_seed(1)
    mlp = tp.ParallelMLP(12, 20)
    attn = tp.ParallelSelfAttention(12, dt.transport.resolve_group(None).size)  # one head per rank
    torch.manual_seed(2)
    x = torch.randn(2, 5, 12, requires_grad=True)
    out = attn(mlp(x))
    lo, hi = tp.shard_range(11)
    logits = tp.parallel_lm_logits(out, torch.randn(11, 12)[lo:hi])
    loss = tp.vocab_parallel_cross_entropy(logits, torch.randint(0, 11, (2, 5)), vocab_size=11).mean()
    loss.backward()
    return [float(loss), float(x.grad.sum())]


def _pipeline_step(schedule: str, m: int, virtual: int) -> list[float]:
    import torch.distributed as dist

    from dt.parallel.pipeline import Pipeline, stage_module

    p = dist.get_world_size()
    torch.manual_seed(3)
    layers = [nn.Linear(6, 6) for _ in range(p * virtual)]
    pipe = Pipeline(stage_module(layers, virtual=virtual))
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)
    loss = pipe.train_step(x, y, nn.functional.mse_loss, micro_batches=m, schedule_name=schedule)
    grads = [float(q.grad.sum()) for c in pipe.chunks for q in c.parameters()]
    return grads + ([loss] if loss is not None else [])


def _pipeline_forward(m: int, virtual: int) -> list[float]:
    import torch.distributed as dist

    from dt.parallel.pipeline import Pipeline, stage_module

    torch.manual_seed(3)
    pipe = Pipeline(stage_module([nn.Linear(6, 6) for _ in range(dist.get_world_size() * virtual)],
                                 virtual=virtual))
    out = pipe.forward(torch.randn(8, 6, generator=torch.Generator().manual_seed(4)), micro_batches=m)
    return [] if out is None else out.sum(dim=1).tolist()


def _train_step(model: str, dp: int, tp_: int, pp: int, *extra: str) -> list[float]:
    """Two steps of dt train's step (dt.train.step: overlapped DDP, the plan's styles, pipeline; with
    experts the step's own gradient sync): the losses."""
    from dt import train
    from dt.models.data import CharData
    from dt.train.build import build

    args = train.parse_args(["--model", model, "--dp", str(dp), "--tp", str(tp_), "--pp", str(pp),
                             "--batch-size", "4", "--block-size", "8", "--n-layer", "2", "--n-head", "2",
                             "--n-embd", "8", "--micro-batches", "2", *extra])
    data = CharData(seed=0)
    run_ = build(args, data.vocab_size)
    per = 4 // dp
    return [run_.step(*(t[run_.coords[0] * per:(run_.coords[0] + 1) * per] for t in data.batch(step, 4, 8)))
            for step in range(2)]


EXPERTS = ("--experts", "3", "--top-k", "2", "--capacity-factor", "1.0")
CASES = {
    "ddp": lambda: _data_parallel_step("ddp"),
    "zero1": lambda: _data_parallel_step("zero1"),
    "zero2": lambda: _data_parallel_step("zero2"),
    "fsdp": lambda: _data_parallel_step("fsdp"),
    "tensor": _tensor_parallel_step,
    "gpipe m4": lambda: _pipeline_step("gpipe", 4, 1),
    "1f1b m1": lambda: _pipeline_step("1f1b", 1, 1),
    "1f1b m5": lambda: _pipeline_step("1f1b", 5, 1),
    "interleaved m4 v2": lambda: _pipeline_step("interleaved", 4, 2),
    "interleaved m6 v2": lambda: _pipeline_step("interleaved", 6, 2),  # 3p, 2p, p does not divide it
    "interleaved m3 v3": lambda: _pipeline_step("interleaved", 3, 3),  # p does not divide it, p, m < p
    "interleaved forward m5 v2": lambda: _pipeline_forward(5, 2),
    "gpt dp2 x pp2": lambda: _train_step("gpt", 2, 1, 2),
    "gpt tp2 x pp2": lambda: _train_step("gpt", 1, 2, 2),
    "llama dp2 x tp2": lambda: _train_step("llama", 2, 2, 1),
    "gpt cp2 ring x ep2 x pp2": lambda: _train_step("gpt", 1, 1, 2, "--cp", "2", "--ep", "2", *EXPERTS),
    "gpt dp2 x cp2 ulysses x ep4": lambda: _train_step("gpt", 2, 1, 1, "--cp", "2", "--ep", "4",
                                                       "--cp-attention", "ulysses", *EXPERTS),
}


def _worker(names: list[str]) -> dict:
    out = {}
    for name in names:
        plain = CASES[name]()
        with rules.recording() as rec:
            under_rules = CASES[name]()
        out[name] = (plain, under_rules, rec.take())
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_parallel_mode_obeys_nccl_rules(run, world):
    names = [n for n in CASES if not (n.split()[0] in ("gpt", "llama") and world != 4)]
    results = run(world, _worker, names, timeout=200)
    failures = []
    for name in names:
        for r, res in enumerate(results):
            plain, ruled, _ = res[name]
            if plain != pytest.approx(ruled, rel=1e-6, abs=1e-9):
                failures.append(f"{name}: rank {r} computes {ruled} under NCCL's rules, {plain} otherwise")
        failures += [f"{name}: {p}" for p in rules.simulate([res[name][2] for res in results])]
    assert not failures, "\n".join(failures[:20])
