"""dt.cost.activations against what autograd actually saves (dt.device_memory.SavedBytes)."""

from __future__ import annotations

import pytest
import torch

from dt.cost.activations import (
    block_activation_bytes,
    layer_activation_bytes,
    recompute_peak_bytes,
    stage_activation_bytes,
)
from dt.cost.flops import Decoder
from dt.device_memory import SavedBytes
from dt.models.gpt import GPT, GPTConfig
from dt.models.llama import Llama, LlamaConfig

pytestmark = pytest.mark.timeout(180)
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float64": 8}


def saved_by(model: torch.nn.Module, b: int, s: int) -> int:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (b, s), generator=g)
    targets = torch.randint(0, model.cfg.vocab_size, (b, s), generator=g)
    with SavedBytes(exclude=[*model.parameters(), *model.buffers()]) as saved:
        model(ids, targets)
    return saved.bytes


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("make", [
    lambda d: GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64, dtype=d)),
    lambda d: GPT(GPTConfig(vocab_size=96, block_size=24, n_layer=3, n_head=2, n_embd=48, tied=False,
                            dtype=d)),
    lambda d: Llama(LlamaConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=64,
                                dtype=d)),
    lambda d: Llama(LlamaConfig(vocab_size=80, block_size=16, n_layer=1, n_head=6, n_kv_head=3, n_embd=96,
                                dtype=d)),
])
def test_plain_models_formula_is_the_measurement(make, dtype):
    model = make(dtype)
    for b, s in ((2, model.cfg.block_size), (3, model.cfg.block_size // 2)):
        arch = Decoder.of(model.cfg, s)
        layers = range(arch.n_layer + 2)
        predicted = stage_activation_bytes(arch, layers, b, ITEMSIZE[dtype], attention="sdpa",
                                           parallelized=False)
        assert predicted == saved_by(model, b, s)  # to the byte


def dt_train_saved(argv: list[str], dtype: str) -> int:
    """What one step of dt train's own build (plain model, dt.parallelize, TrainStep) saves on this rank."""
    import torch.distributed as dist

    from dt import train
    from dt.train.build import build
    args = train.parse_args(argv)
    args.dtype = dtype  # the model's own dtype (the command line offers float32 and float64)
    run = build(args, 64)
    g = torch.Generator().manual_seed(dist.get_rank())  # other tokens on every rank: routing differs
    ids, targets = (torch.randint(0, 64, (args.batch_size // args.dp, args.block_size), generator=g)
                    for _ in range(2))
    model = run.parallel_model.model
    with SavedBytes(exclude=[*model.parameters(), *model.buffers()]) as saved:
        run.step(ids, targets)
    return saved.bytes


def dt_train_saved_each(cases: list[tuple[list[str], str]]) -> list[int]:
    """dt_train_saved of each (argv, dtype), in one launch."""
    return [dt_train_saved(argv, dtype) for argv, dtype in cases]


def _argv(n_layer: int, *extra: str) -> list[str]:
    return ["--block-size", "32", "--n-layer", str(n_layer), "--n-head", "4", "--n-embd", "64",
            "--micro-batches", "1", "--threads", "1", "--no-progress", *extra]


MODELS = {"gpt": GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64),
          "llama": LlamaConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)}
# (world, tp, cp, cp attention, sequence parallel): torch's fused attention, tensor parallel, ring
# attention and Ulysses, sequence parallel
LAYOUTS = {1: [(1, 1, "ring", False)],
           2: [(2, 1, "ring", False), (1, 2, "ring", False), (1, 2, "ulysses", False), (2, 1, "ring", True)]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 2])
def test_dt_train_model_formula_is_the_measurement(run, world):
    """What dt train runs (the plain model as dt.parallelize splits it, in TrainStep), GPT and Llama,
    with each --recompute (none, selective: the attention core alone, full) and --sequence-parallel."""
    cases, predicted = [], []
    for model, cfg in MODELS.items():
        arch = Decoder.of(cfg)
        kv = ["--model", "llama", "--n-kv-head", "2"] if model == "llama" else []
        for tp, cp, attention, sp in LAYOUTS[world]:
            if model == "llama" and attention == "ulysses":
                continue  # Ulysses needs whole kv heads per cp rank: GPT's case covers it
            for recompute in ("none", "selective", "full"):
                for dtype in ("float32", "bfloat16"):
                    cases.append((_argv(2, "--batch-size", "2", "--tp", str(tp), "--cp", str(cp),
                                        "--cp-attention", attention, "--recompute", recompute, *kv,
                                        *(["--sequence-parallel"] if sp else [])), dtype))
                    predicted.append(stage_activation_bytes(arch, range(4), 2, ITEMSIZE[dtype], tp=tp, cp=cp,
                                                            sequence_parallel=sp, recompute=recompute))
    for measured in run(world, dt_train_saved_each, cases, timeout=280):
        wrong = [(argv, dtype, m, p) for (argv, dtype), m, p in zip(cases, measured, predicted) if m != p]
        assert not wrong, wrong  # to the byte


def written_out_saved(dtype: str, s: int) -> tuple[int, int]:
    """attention="dt" on tp ranks: a block of dt.parallel.tensor's layers (its attention written out),
    and a head of ln_f, the vocabulary-parallel logits and cross-entropy."""
    from torch import nn

    from dt.parallel import tensor as tp
    kind = getattr(torch, dtype)
    torch.manual_seed(0)
    norms = nn.LayerNorm(64), nn.LayerNorm(64), nn.LayerNorm(64)
    attn, mlp = tp.ParallelSelfAttention(64, 4, causal=True), tp.ParallelMLP(64, 256)
    lo, hi = tp.shard_range(96)
    vocab = nn.Parameter(torch.randn(96, 64)[lo:hi])  # this rank's rows of the word embedding
    parts = [*norms, attn, mlp]
    for m in parts:
        m.to(kind)
    vocab.data = vocab.data.to(kind)
    weights = [vocab, *(p for m in parts for p in m.parameters())]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, s, 64, generator=g).to(kind).requires_grad_()  # ln_1 keeps it: not excluded
    targets = torch.randint(0, 96, (2, s), generator=g)
    with SavedBytes(exclude=weights) as block:
        h = x + attn(norms[0](x))
        (h + mlp(norms[1](h))).sum().backward()
    with SavedBytes(exclude=weights) as head:
        logits = tp.parallel_lm_logits(norms[2](x), vocab)
        tp.vocab_parallel_cross_entropy(logits, targets, vocab_size=96).mean().backward()
    return block.bytes, head.bytes


@pytest.mark.parametrize("world", [1, 2])
def test_written_out_attention_is_the_measurement(run, world):
    """attention="dt": the s^2 softmax and mask torch's fused kernel does not keep, and the
    vocabulary-parallel loss (the rank's softmax slice) in place of the gathered one."""
    for dtype, s in (("float32", 32), ("bfloat16", 16)):
        arch = Decoder.of(GPTConfig(vocab_size=96, block_size=s, n_layer=1, n_head=4, n_embd=64))
        predicted = tuple(layer_activation_bytes(arch, i, 2, ITEMSIZE[dtype], tp=world, attention="dt")
                          for i in (1, 2))
        assert run(world, written_out_saved, dtype, s) == [predicted] * world


def test_korthikanti_less_what_dt_does_not_run():
    """s b h (34 + 5 a s / h) at 16 bits, less dropout (2 sbh masks, 3 a s^2 b), plus dt's causal
    mask (s^2 bools) and the two norms' mean and rstd (4 b s of 2 bytes); torch's fused kernel
    keeps no s^2 term (Korthikanti's 34 sbh, selective recompute) but its log-sum-exp (4 a b s)."""
    for s, b, h, a in ((2048, 4, 12288, 96), (1024, 8, 768, 12), (32, 2, 64, 4)):
        arch = Decoder.of(GPTConfig(vocab_size=256, block_size=s, n_layer=1, n_head=a, n_embd=h))
        korthikanti = s * b * h * (34 + 5 * a * s / h)
        dt_block = korthikanti - 2 * s * b * h - 3 * a * s * s * b + s * s + 4 * 2 * b * s
        assert layer_activation_bytes(arch, 1, b, 2, attention="dt") == pytest.approx(dt_block, rel=1e-12)
        fused = 34 * s * b * h - 2 * s * b * h + 4 * a * b * s + 4 * 2 * b * s
        assert layer_activation_bytes(arch, 1, b, 2) == pytest.approx(fused, rel=1e-12)


def test_splits_and_recompute():
    arch = Decoder.of(GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=8, n_embd=256))
    s, b, h, e = 128, 2, 256, 2
    one = layer_activation_bytes(arch, 1, b, e, attention="dt")
    # tp without sp: Korthikanti's split: 4 e sbh replicated (+ norm stats, mask), the rest / t
    parts = block_activation_bytes(arch, b, e, tp=4, attention="dt")
    assert parts["norms"] + parts["attention_input"] + parts["mlp_input"] == 4 * e * s * b * h + 4 * e * b * s
    # with sequence parallel everything divides by t but the (tiny, replicated) causal mask and the
    # matmul inputs, which the column-parallel layers keep gathered whole
    sp = layer_activation_bytes(arch, 1, b, e, tp=4, sequence_parallel=True, attention="dt")
    gathered = 2 * e * s * b * h
    assert sp - s * s - gathered == pytest.approx((one - s * s - gathered) / 4)
    assert layer_activation_bytes(arch, 1, b, e, recompute="full") == e * s * b * h
    softmax_and_mask = e * 8 * s * s * b + s * s
    selective = layer_activation_bytes(arch, 1, b, e, recompute="selective", attention="dt")
    assert selective == one - softmax_and_mask
    assert recompute_peak_bytes(arch, b, e, attention="dt") == one
    assert recompute_peak_bytes(arch, b, e, attention="dt", recompute="selective") == softmax_and_mask
    fused = layer_activation_bytes(arch, 1, b, e)  # torch's kernel keeps no s^2 term, its log-sum-exp
    lse = 4 * 8 * b * s
    assert layer_activation_bytes(arch, 1, b, e, recompute="selective") == fused - lse
    assert recompute_peak_bytes(arch, b, e) == fused
    assert recompute_peak_bytes(arch, b, e, recompute="none") == 0
    # ring attention's output too (the projection keeps its own copy)
    ring = layer_activation_bytes(arch, 1, b, e, cp=2) - layer_activation_bytes(arch, 1, b, e, cp=2,
                                                                               recompute="selective")
    assert ring == e * s // 2 * b * h + e * 8 * b * s // 2
    with pytest.raises(ValueError, match="recompute must be one of"):
        layer_activation_bytes(arch, 1, b, e, recompute="half")
    with pytest.raises(ValueError, match="attention must be one of"):
        layer_activation_bytes(arch, 1, b, e, attention="flash")
    with pytest.raises(ValueError, match="mixture of experts is"):
        layer_activation_bytes(Decoder(**{**arch.__dict__, "n_experts": 4}), 1, b, e, parallelized=False)


def measured_stash(cases: list[tuple[str, int, int]]) -> list[tuple[int, int, int]]:
    """(stage, stages, peak stash) of the runtime for each (schedule, m, v)."""
    from torch import nn

    from dt.parallel.pipeline import Pipeline, stage_module
    out = []
    for name, m, v in cases:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(3, 3) for _ in range(8)])
        pipe = Pipeline(stage_module(model, None, virtual=v))
        x, y = torch.randn(8, 3), torch.randn(8, 3)
        pipe.train_step(x if pipe.is_first else None, y if pipe.is_last else None,
                        torch.nn.functional.mse_loss, micro_batches=m, schedule_name=name)
        out.append((pipe.stage, pipe.stages, pipe.stats.peak_stash))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_peak_stash_replays_the_runtime(run, world):
    from dt.parallel.pipeline import peak_stash
    cases = [("gpipe", 4, 1), ("1f1b", 1, 1), ("1f1b", 3, 1), ("1f1b", 8, 1), ("interleaved", 4, 2),
             ("interleaved", 2, 2)]
    for rank in run(world, measured_stash, cases):
        for (name, m, v), (stage, stages, measured) in zip(cases, rank):
            assert peak_stash(name, stages, stage, m, v) == measured, (name, m, v, stage)
    assert peak_stash("1f1b", 4, 0, 8) == 4 and peak_stash("1f1b", 4, 3, 8) == 1  # p - s
    assert peak_stash("gpipe", 4, 2, 8) == 8


def test_peak_stash_bytes_weighs_the_chunks():
    from dt.parallel.pipeline import peak_stash_bytes, stash_profile
    # interleaved p=2, m=2, v=2 on stage 0: F(0,0) F(0,1) F(1,0) F(1,1), then the backwards
    assert stash_profile("interleaved", 2, 0, 2, 2, [10.0, 1.0])[:4] == [10, 20, 21, 22]
    assert peak_stash_bytes("interleaved", 2, 0, 2, [10.0, 1.0]) == 22
    assert peak_stash_bytes("1f1b", 4, 0, 8, [5.0]) == 20
    with pytest.raises(ValueError, match="one figure per chunk"):
        stash_profile("gpipe", 2, 0, 2, 1, [1.0, 2.0])


def test_accumulated_gradients_beside_the_stash():
    """Each chunk's summed .grad, from its first backward until its last begins (dt.plan.memory's
    gradient accumulation under DDP), on top of the stash the order holds at each action."""
    from dt.parallel.pipeline import peak_stash_bytes
    assert peak_stash_bytes("1f1b", 1, 0, 2, [5.0], [100.0]) == 105  # F B F B: the second forward's
    assert peak_stash_bytes("1f1b", 1, 0, 1, [5.0], [100.0]) == 5  # one micro-batch: nothing summed
    assert peak_stash_bytes("1f1b", 2, 0, 2, [5.0], [100.0]) == 105  # F F B B: one left beside it
    assert peak_stash_bytes("1f1b", 4, 0, 8, [5.0], [1.0]) == 21  # the steady state refills to p - s
    assert peak_stash_bytes("gpipe", 2, 1, 4, [1.0], [10.0]) == 13  # every forward first
    # interleaved p=2, m=2, v=2 on stage 0: F(0,0) F(0,1) F(1,0) F(1,1) B(1,0) B(1,1) B(0,0) B(0,1):
    # chunk 1's gradient beside 21 bytes; chunk 0's beside 10, after chunk 1's has synced
    assert peak_stash_bytes("interleaved", 2, 0, 2, [10.0, 1.0], [100.0, 1000.0]) == 1021
    assert peak_stash_bytes("interleaved", 2, 0, 2, [10.0, 1.0], [1000.0, 100.0]) == 1010
    assert peak_stash_bytes("interleaved", 2, 0, 2, [10.0, 1.0], [0.0, 0.0]) == 22


@pytest.mark.parametrize("world", [1, 2])
def test_moe_block_formula_is_the_measurement(run, world):
    """dt train's MoE GPT (the plain one, experts swapped for dt.parallel.expert's over ep = dp ranks):
    one rank exactly (uniform = actual rows at ep 1); over ep ranks the rows received add up to
    the rows sent, so the ranks' sum is exact whatever the routing."""
    for top_k in (1, 2):
        arch = Decoder.of(GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=4, n_embd=64,
                                    n_experts=4, top_k=top_k))
        argv = _argv(1, "--batch-size", str(2 * world), "--dp", str(world), "--ep", str(world),
                     "--experts", "4", "--top-k", str(top_k))
        measured = run(world, dt_train_saved, argv, "float32")
        assert sum(measured) == world * stage_activation_bytes(arch, range(3), 2, 4)


def test_a_fused_rms_norm_keeps_its_input_and_rsqrt():
    """A stack whose RMSNorm is one kernel (nanotron's TritonRMSNorm) keeps per norm its input (e sbh)
    and a float32 rsqrt (4 bs), where dt's keeps a float32 copy (4 sbh), the rsqrt and the normed copy:
    2 x 2 norms per block and the final norm's, by hand."""
    arch = Decoder.of(LlamaConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=64))
    s, b, h, e = 32, 3, 64, 2
    sbh, bs = s * b * h, s * b
    dt_norm, fused_norm = 4 * sbh + 4 * bs + e * sbh, e * sbh + 4 * bs
    for layer, norms in ((1, 2), (arch.n_layer + 1, 1)):
        plain = layer_activation_bytes(arch, layer, b, e)
        fused = layer_activation_bytes(arch, layer, b, e, fused_norm=True)
        assert plain - fused == norms * (dt_norm - fused_norm)
    assert layer_activation_bytes(arch, 0, b, e, fused_norm=True) == layer_activation_bytes(arch, 0, b, e)
    assert recompute_peak_bytes(arch, b, e, fused_norm=True) == layer_activation_bytes(arch, 1, b, e,
                                                                                      fused_norm=True)
