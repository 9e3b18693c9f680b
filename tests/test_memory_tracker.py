"""dt.device_memory.LiveBytes against tensors of known size, and a model against dt.cost.activations."""

from __future__ import annotations

import gc

import pytest
import torch

from dt.cost.activations import stage_activation_bytes
from dt.cost.flops import Decoder
from dt.device_memory import LiveBytes
from dt.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.timeout(120)


def test_allocations_and_frees_of_known_size():
    with LiveBytes() as live:
        a = torch.empty(1000)  # 4000 B
        b = torch.empty(250, dtype=torch.float64)  # 2000 B
        assert (live.current, live.peak) == (6000, 6000)
        del a
        gc.collect()
        assert (live.current, live.peak) == (2000, 6000)
        c = torch.empty(100, dtype=torch.int8)
        assert (live.current, live.peak) == (2100, 6000)
        del b, c
    assert (live.current, live.peak) == (0, 6000)


def test_views_and_in_place_ops_are_not_counted_again():
    before = torch.ones(512)  # made outside: the baseline, never counted
    with LiveBytes() as live:
        before.add_(1).mul_(2)
        view = before.view(16, 32).t()[:4]
        assert live.current == 0
        x = torch.zeros(64, 64)  # 16384 B
        x.add_(1)
        y = x.view(-1)[::2]
        x.transpose(0, 1).abs_()
        torch.add(x, 1, out=x)
        assert live.current == 16384
        z = y.contiguous()  # a copy: a new storage of half the size
        assert live.current == 16384 + 8192
        del x, y, z, view
    assert live.current == 0 and live.peak == 16384 + 8192


def test_transient_peak_is_seen():
    with LiveBytes() as live:
        x = torch.ones(1000)
        (x * 2 + 1).sum()  # x * 2 is freed as soon as + 1 has read it, before the sum
    assert live.peak == 3 * 4000  # x, x * 2 and (x * 2) + 1 at once
    assert live.current == 4000  # x survives (the sum's result was dropped)


def test_reset_peak_starts_a_phase_whose_frees_of_earlier_bytes_count():
    with LiveBytes() as live:
        x = torch.ones(1000)
        y = x * 2
        assert live.peak == 8000
        live.reset_peak()
        assert live.peak == live.current == 8000
        del x  # made before the reset: its bytes go
        z = y + 1
        assert (live.current, live.peak) == (8000, 8000)
        w = z * 2
        assert live.peak == 12000
        del y, z, w
    assert (live.current, live.peak) == (0, 12000)


def test_a_storage_resized_in_place_counts_its_new_size():
    """FSDP frees a gathered unit by resizing its storage to 0 and refills it for backward: the
    storage stays alive throughout, and its bytes are what it holds at each moment."""
    before = torch.empty(64)  # made outside: its resizes are the baseline's, never counted
    with LiveBytes() as live:
        x = torch.ones(1000)  # 4000 B
        view = x[10:20]  # a view keeps the storage alive while it is empty
        x.untyped_storage().resize_(0)
        assert (live.current, live.peak) == (0, 4000)
        y = torch.empty(250, dtype=torch.float64)  # 2000 B: fits under the freed unit's
        assert (live.current, live.peak) == (2000, 4000)
        x.untyped_storage().resize_(4000)
        assert (live.current, live.peak) == (6000, 6000)
        x.resize_(1500)  # a tensor's resize_ (the dispatcher's): grows the storage to 6000 B
        assert (live.current, live.peak) == (8000, 8000)
        x.resize_(10)  # a tensor shrunk keeps its storage's bytes
        assert live.current == 8000
        before.untyped_storage().resize_(0)
        assert live.current == 8000
        del view, y
        gc.collect()
        assert live.current == 6000
    x.untyped_storage().resize_(0)  # after the block: nobody counts, torch's own resize_ again
    assert (live.current, live.peak, x.untyped_storage().nbytes()) == (6000, 8000, 0)


def test_model_forward_keeps_the_activation_formula_and_backward_frees_it():
    cfg = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64)
    model = GPT(cfg)
    b, s = 4, 32
    ids, targets = torch.randint(0, 64, (b, s)), torch.randint(0, 64, (b, s))
    predicted = stage_activation_bytes(Decoder.of(cfg), range(cfg.n_layer + 2), b, 4, attention="sdpa")
    with LiveBytes() as live:
        x, y = ids.clone(), targets.clone()  # the batch: made inside, as the formula counts it
        logits, loss = model(x, y)
        forward_end = live.current
        held = forward_end - logits.nbytes - loss.nbytes  # what the caller holds is not saved
        loss.backward()
        del logits, loss
        gc.collect()
        grads = sum(p.grad.nbytes for p in model.parameters())
        after = live.current
    assert held == pytest.approx(predicted, rel=0.01)
    assert after == grads + x.nbytes + y.nbytes  # the activations are gone; gradients and the batch stay
    assert live.peak > max(forward_end, after)  # backward's gradients arrive before the activations go


def test_cuda_reads_the_allocator():
    if not torch.cuda.is_available():
        pytest.skip("no GPU here: the CUDA path reads torch.cuda.max_memory_allocated")
    with LiveBytes("cuda") as live:
        x = torch.empty(1 << 20, device="cuda")
        del x
    assert live.peak >= 4 << 20 and live.current == 0


def train_step_memory(dp: int, tp: int, pp: int, micro_batches: int, batch: int) -> dict:
    """dt train's own build (plain GPT, dt.parallelize, TrainStep) on this grid: the second step's
    live-byte peak, and what is held after it."""
    from dt import train
    from dt.parallel.zero.memory import memory_held
    from dt.train.build import build
    args = train.parse_args(["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--batch-size",
                             str(batch * dp), "--micro-batches", str(micro_batches), "--block-size", "32",
                             "--n-layer", "2",
                             "--n-head", "4", "--n-embd", "64", "--threads", "1", "--no-progress"])
    run = build(args, 64)
    dp_rank, stage = run.coords[0], run.coords[2]
    g = torch.Generator().manual_seed(dp_rank)
    ids, targets = (torch.randint(0, 64, (batch, 32), generator=g) for _ in range(2))
    for _ in range(2):  # the first step makes the optimizer's state and the collectives' scratch
        with LiveBytes() as live:
            run.step(ids, targets)  # zero_grad, the pipeline, the gradient sync, the optimizer step
    held = memory_held(run.parameters, [p.grad for p in run.parameters], run.optimizer)
    return {"stage": stage, "peak": live.peak, **held}


@pytest.mark.parametrize("world,dp,tp,pp,m,batch", [(1, 1, 1, 1, 1, 4), (1, 1, 1, 1, 2, 4),
                                                    (2, 2, 1, 1, 1, 4), (2, 1, 1, 2, 2, 4),
                                                    (2, 1, 2, 1, 1, 4)])
@pytest.mark.timeout(240)
def test_rank_memory_predicts_the_measured_step(run, world, dp, tp, pp, m, batch):
    from dt.parallel.rank_memory import rank_memory
    arch = Decoder.of(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64))
    for r in run(world, train_step_memory, dp, tp, pp, m, batch):
        mem = rank_memory(arch, batch // m, m, 4, tp=tp, pp=pp, dp=dp, stage=r["stage"])
        assert mem.params == r["params"] and mem.optimizer == r["optimizer"]  # exact
        assert mem.step_grads == r["grads"]
        assert mem.step_peak == pytest.approx(r["peak"], rel=0.10), (r, mem.as_dict())


def test_rank_memory_holds_zero_formula_bytes():
    """fp32 + Adam: 16 Psi held at stage 0 (params, a step's gradients, two moments), 8 Psi + 8 Psi/N,
    4 Psi + 12 Psi/N and 16 Psi/N for ZeRO 1, 2, 3 (Rajbhandari et al. 2020), N = dp."""
    from dt.cost.flops import layer_params
    from dt.parallel.rank_memory import rank_memory
    arch = Decoder.of(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64))
    psi, n = sum(layer_params(arch, i) for i in range(4)), 4
    want = {0: 16 * psi, 1: 8 * psi + 8 * psi / n, 2: 4 * psi + 12 * psi / n, 3: 16 * psi / n}
    for stage, total in want.items():
        mem = rank_memory(arch, 2, 1, 4, dp=n, zero=stage)
        assert mem.params + mem.step_grads + mem.optimizer == pytest.approx(total)
        assert mem.held_grads == (mem.step_grads if stage >= 2 else 0)
        assert mem.peak >= mem.held + mem.activations  # the peak holds the stash on top of what is held
        # the ring's reduce-scatter of DDP's bucket or ZeRO 1-2's flat gradient (the whole of this
        # tiny model) keeps its input and two of its four chunks: 1.5 x 4 Psi bytes
        # (ZeroOptimizer.formula's); FSDP's units are not modelled here
        assert mem.scratch == (6 * psi if stage < 3 else 0)


def tensor_parallel_build_peak(tp: int) -> dict:
    """The live-byte peak of building a plain GPT and swapping in its tensor-parallel layers on
    `tp` ranks; the bytes of the plain model, of its tied word table's shard and of its largest
    layer's shard (weights and bias)."""
    from dt.parallel.grid import Grid
    from dt.parallel.plan import gpt_plan, parallelize
    cfg = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64)
    with LiveBytes() as live:
        model = GPT(cfg)
        whole = sum(p.numel() for p in model.parameters()) * 4
        largest = max(sum(p.numel() for p in m.parameters(recurse=False))
                      for m in model.modules() if isinstance(m, torch.nn.Linear)) * 4
        table = model.layers[0].wte.weight.numel() * 4
        parallelize(model, Grid({"tp": tp}), gpt_plan(cfg, tp))
    return {"peak": live.peak, "whole": whole, "largest": largest // tp, "table": table // tp}


@pytest.mark.parametrize("tp", [1, 2])
def test_building_holds_the_plain_model_and_one_layers_copy(run, tp):
    """Each swapped-out layer is freed at once (the ties are weak), so building holds the plain
    model, the tied word table's shard (its old table lives until the head that shares it is
    swapped) and one layer's shard being made (and the groups' few scalars: 64 bytes); not the
    plain model and a whole copy of it."""
    for r in run(tp, tensor_parallel_build_peak, tp):
        assert r["whole"] < r["peak"] <= r["whole"] + r["table"] + r["largest"] + 64, r
