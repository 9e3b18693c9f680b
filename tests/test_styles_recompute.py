"""Recompute: every block under torch.utils.checkpoint (non-reentrant), gradients bit for bit the same.

Saved activations are counted in bytes by torch.autograd.graph.saved_tensors_hooks
(what autograd keeps for backward outside the recomputed blocks), not by RSS.
tests/test_styles_loss.py runs recompute under tensor and sequence parallelism.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint

from dt.device_memory import SavedBytes
from dt.models.gpt import GPT, GPTConfig
from dt.models.llama import Llama, LlamaConfig
from dt.parallel.grid import Grid
from dt.parallel.plan import gpt_recompute, llama_recompute, parallelize
from dt.parallel.recompute import Recompute, recomputed

GPT_CFG = {"vocab_size": 31, "block_size": 32, "n_layer": 3, "n_head": 4, "n_embd": 32, "seed": 2,
           "dtype": "float64"}
MODELS = [(GPT, GPTConfig, GPT_CFG, range(1, 4)),
          (GPT, GPTConfig, {**GPT_CFG, "n_experts": 3, "top_k": 2, "capacity_factor": 1.0}, range(1, 4)),
          (Llama, LlamaConfig, {**GPT_CFG, "n_kv_head": 2}, range(3))]


def _step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[int, torch.Tensor, dict]:
    """Bytes autograd saved for backward, the loss, and every gradient."""
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids[:, :-1], ids[:, 1:])[1]
    loss.backward()
    return saved[0], loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("build, config, cfg, blocks", MODELS)
def test_recompute_gives_the_same_gradients_and_saves_less(build, config, cfg, blocks):
    ids = torch.randint(0, 31, (4, 33), generator=torch.Generator().manual_seed(0))
    plain, model = build(config(**cfg)), build(config(**cfg))
    parallelize(model, Grid({"tp": 1}, rank=0), {f"layers.{i}": Recompute() for i in blocks})
    assert all(recomputed(model.layers[i]) for i in blocks)
    assert sum(recomputed(m) for m in model.modules()) == len(blocks)  # the blocks, nothing else
    saved_plain, loss_plain, grads_plain = _step(plain, ids)
    # Recomputed to the end (torch stops early by default, once the last saved tensor is rebuilt,
    # before an MoE's counters): the counters must still count each token once.
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        saved, loss, grads = _step(model, ids)
    assert torch.equal(loss, loss_plain)
    assert grads.keys() == grads_plain.keys()
    for name, g in grads.items():
        assert torch.equal(g, grads_plain[name]), name  # the same operations on the same values
    assert saved < saved_plain / 3, (saved, saved_plain)  # only each block's input is kept
    counted = [(m.counted, p.counted) for m, p in zip(model.modules(), plain.modules())
               if hasattr(m, "counted")]
    assert all(mine == theirs for mine, theirs in counted)  # recomputation counts no token twice
    assert len(counted) == (3 if "n_experts" in cfg else 0)


def test_recompute_refuses_a_block_twice():
    model = GPT(GPTConfig(n_layer=1))
    plan = {"layers.1": Recompute()}
    parallelize(model, Grid({"tp": 1}, rank=0), plan)
    with pytest.raises(ValueError, match="layers.1: Recompute is applied once per block"):
        parallelize(model, Grid({"tp": 1}, rank=0), plan)


@pytest.mark.parametrize("build, config, cfg, recompute", [(GPT, GPTConfig, GPT_CFG, gpt_recompute),
                                                           (Llama, LlamaConfig, {**GPT_CFG, "n_kv_head": 2},
                                                            llama_recompute)])
def test_selective_recompute_reruns_the_attention_core_alone(build, config, cfg, recompute):
    """Korthikanti's selective recompute: only each attention core is wrapped; the same gradients bit
    for bit, and what is saved falls by exactly what the cores kept beyond their inputs (torch's
    fused kernel: its output is the projection's input, so only its log-sum-exp, float32 a b s)."""
    ids = torch.randint(0, 31, (4, 33), generator=torch.Generator().manual_seed(0))
    cfg = {**cfg, "dtype": "float32"}  # torch's fused kernel on the CPU (float64 takes the math path)
    plain, model = build(config(**cfg)), build(config(**cfg))
    parallelize(model, Grid({"tp": 1}, rank=0), recompute(model.cfg, "selective"))
    wrapped = [n for n, m in model.named_modules() if recomputed(m)]
    assert len(wrapped) == cfg["n_layer"] and all(n.endswith("attn.attend") for n in wrapped), wrapped
    saved = []
    for m in (plain, model):
        with SavedBytes(exclude=[*m.parameters(), *m.buffers()]) as kept:
            loss = m(ids[:, :-1], ids[:, 1:])[1]
        loss.backward()
        saved.append((kept.bytes, loss.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (saved_plain, loss_plain, grads_plain), (saved, loss, grads) = saved
    assert torch.equal(loss, loss_plain)
    for name, g in grads.items():
        assert torch.equal(g, grads_plain[name]), name
    lse = 4 * cfg["n_head"] * 4 * 32  # float32, per head, sequence and token
    assert saved == saved_plain - cfg["n_layer"] * lse, (saved, saved_plain)
    assert recompute(model.cfg, "none") == {} and recompute(model.cfg, True).keys() == \
        recompute(model.cfg, "full").keys()
    with pytest.raises(ValueError, match="recompute must be one of none, selective, full"):
        recompute(model.cfg, "attention")
