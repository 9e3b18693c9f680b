"""TrainStep's accounting: every byte under the label of the package that moved it, none as "other".

Each layout family dt train accepts (DDP, tensor, a pipeline with its tied
embedding, context parallel by ring and by Ulysses, experts, ZeRO 1-3) runs a
few steps through dt.train.build's step (tests/test_train_layouts.py's
_stepped); "other" must be 0 on every rank, and where a label has a cost model
its bytes must be that model's exactly: the data label ZeRO's and FSDP's
(zero_traffic_formula, through expected_bytes_sent), the context label
dt.cost's ring_attention_traffic or ulysses_traffic per attention call.
"""

from __future__ import annotations

import argparse

import pytest

from dt.cost import ring_attention_traffic, ulysses_traffic
from dt.parallel.context.style import sequence_layout
from dt.parallel.pipeline.schedules import stage_layers
from tests.test_step import _args
from tests.test_train_layouts import EXPERTS, _stepped

FORMULA = {"ring": ring_attention_traffic, "ulysses": ulysses_traffic}


def context_bytes(args: argparse.Namespace, rank: int, recomputes: bool = False) -> int:
    """Bytes one rank sends per step in context-parallel attention: its stage's blocks' attention,
    once a micro-batch forward (twice with recompute) and once backward, at the model's float64."""
    if args.cp == 1:
        return 0
    cp_rank, pp_rank = rank // args.tp % args.cp, rank // (args.dp * args.cp * args.tp)  # tp innermost
    layers = [i for r in stage_layers(args.n_layer + 2, args.pp, pp_rank, None, args.virtual) for i in r]
    blocks = sum(1 for i in layers if 1 <= i <= args.n_layer)  # [embedding, blocks..., head]
    layout = sequence_layout(args.block_size, args.cp)
    sizes = [layout.size(r) for r in range(args.cp)]
    micro = args.batch_size // args.dp // args.micro_batches
    heads, head_dim = args.n_head // args.tp, args.n_embd // args.n_head
    fwd, bwd = FORMULA[args.cp_attention](sizes, micro, heads, head_dim, 8, cp_rank)
    per_call = (2 if recomputes else 1) * fwd.bytes_sent + bwd.bytes_sent
    return blocks * args.micro_batches * per_call


WORLD2 = [("gpt", {"dp": 2}), ("gpt", {"tp": 2}), ("gpt", {"pp": 2, "schedule": "gpipe"}),
          ("llama", {"pp": 2}), ("gpt", {"cp": 2}), ("gpt", {"cp": 2, "cp_attention": "ulysses"}),
          ("llama", {"cp": 2, "zero": 2}), ("gpt", {"dp": 2, "ep": 2, **EXPERTS}),
          ("gpt", {"cp": 2, "ep": 2, "zero": 1, **EXPERTS}), ("gpt", {"dp": 2, "zero": 3})]
WORLD4 = [("gpt", {"cp": 2, "tp": 2, "clip": 0.5}), ("gpt", {"cp": 2, "pp": 2}),
          ("llama", {"cp": 2, "dp": 2, "zero": 3, "cp_attention": "ulysses", "n_kv_head": 2}),
          ("gpt", {"cp": 2, "dp": 2, "ep": 4, **EXPERTS})]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world, runs", [(2, WORLD2), (4, WORLD4)])
def test_every_byte_is_under_its_package_label(run, world, runs):
    results = run(world, _stepped, runs, timeout=280)
    for k, (model, kw) in enumerate(runs):
        args = _args(model, **kw)
        for rank, r in enumerate(results):
            sent = r[k]["sent"]
            assert sent["other"] == 0, (model, kw, rank, sent)
            assert sent["context"] == context_bytes(args, rank), (model, kw, rank, sent)
            if r[k]["formula"] is not None:  # ZeRO's and FSDP's own arithmetic
                assert sent["data"] == r[k]["formula"], (model, kw, rank, sent, r[k]["formula"])
            if args.dp * args.cp > 1:
                assert sent["data"] > 0, (model, kw, sent)
            routed = args.ep > 1 or bool(args.experts) and args.cp > 1  # the router sees whole sequences
            for kind, on in (("tensor", args.tp > 1), ("pipeline", args.pp > 1), ("expert", routed)):
                assert (sent[kind] > 0) == on, (model, kw, kind, sent)
