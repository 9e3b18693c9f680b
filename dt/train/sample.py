"""`dt sample`: text from a `dt train` checkpoint.

    dt sample --checkpoint ckpt --prompt "The cat"                      # 200 tokens, temperature 0.8
    dt sample --checkpoint ckpt --prompt "def " --temperature 0 --max-new-tokens 50   # greedy
    dt sample --checkpoint ckpt --prompt "Once" --top-k 20 --samples 3 --seed 1

Reads the newest good checkpoint in DIR (its manifest and sha256s checked, as
resuming checks them), the model configuration it was saved with and the
tokenizer `dt train` saved in its manifest, assembles every
tensor whole from the shards whatever mesh saved them (dt.parallel.checkpoint
.read_full), and generates with the plain model's generate (dt.models.gpt.GPT or
dt.models.llama.Llama): one process, no process group. The prompt is kept to the last block_size tokens
the model can see; sampling is seeded (--seed), so a command gives the same text again.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import torch

from dt import args as args_
from dt.models.gpt import GPT, GPTConfig
from dt.models.llama import Llama, LlamaConfig
from dt.models.lm import LanguageModel
from dt.parallel.checkpoint import CheckpointError, latest, read_full
from dt.train.tokenizer import Tokenizer, tokenizer_from_json
from dt.units import fmt_optional

__all__ = ["load_model", "main", "parse_args"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = args_.Parser(prog="dt sample", description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[1],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="a dt train --checkpoint directory")
    p.add_argument("--prompt", default="\n", help="the text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=args_.at_least(1), default=200)
    p.add_argument("--temperature", type=args_.non_negative, default=0.8,
                   help="0: always the most likely token; higher: more varied")
    p.add_argument("--top-k", type=args_.at_least(1), default=None,
                   help="draw only from the k most likely tokens")
    p.add_argument("--samples", type=args_.at_least(1), default=1, help="independent continuations")
    p.add_argument("--seed", type=args_.at_least(0), default=0)
    return p.parse_args(argv)


def load_model(directory: str) -> tuple[LanguageModel, Tokenizer, int]:
    """The newest checkpoint's plain model (whole, in float32 or its dtype), its tokenizer, its step.

    CheckpointError for a directory without a usable dt train checkpoint.
    """
    ckpt, _ = latest(directory)
    if ckpt is None:
        raise CheckpointError(f"{directory}: holds no checkpoint (dt train --checkpoint DIR makes one)")
    meta = ckpt.meta
    if meta.get("trainer") != "dt train":
        raise CheckpointError(f"checkpoint {ckpt.path}: not saved by dt train")
    saved = meta.get("model", {})
    model = _plain_model(saved, ckpt.path)
    if "tokenizer" not in meta:
        raise CheckpointError(f"checkpoint {ckpt.path}: saved without its tokenizer (by an older dt train)")
    tokenizer = tokenizer_from_json(meta["tokenizer"], f"checkpoint {ckpt.path}'s tokenizer")
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise CheckpointError(f"checkpoint {ckpt.path}: its tokenizer has {tokenizer.vocab_size} tokens, "
                              f"the model {model.cfg.vocab_size}")
    _, tensors = read_full(ckpt.path)
    # The optimizer's state is saved as optim/<parameter>/<key> (dt.parallel.checkpoint): not the model's.
    tensors = {k: v for k, v in tensors.items() if not k.startswith("optim/")}
    _load_weights(model, tensors, ckpt.path)
    return model.eval(), tokenizer, ckpt.step


def _plain_model(saved: dict[str, Any], where: str) -> LanguageModel:
    """The plain model a checkpoint's config describes: Llama's has n_kv_head, the GPT's not.

    A config is the plain model's own (every dt train checkpoint saves those fields):
    fields the model does not know are dropped; experts are refused unless it has them.
    """
    cls, config = (Llama, LlamaConfig) if "n_kv_head" in saved else (GPT, GPTConfig)
    fields = {f.name for f in dataclasses.fields(config)}
    if saved.get("n_experts") and "n_experts" not in fields:
        raise CheckpointError(f"checkpoint {where}: a mixture of {saved['n_experts']} experts; the plain "
                              f"{cls.__name__} dt sample runs is dense")
    return cls(config(**{k: v for k, v in saved.items() if k in fields}))


def _load_weights(model: LanguageModel, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Every parameter from the checkpoint by its name; a tied head is its embedding (saved once)."""
    mine = model.state_dict()
    saved_ptrs = {mine[name].data_ptr() for name in tensors if name in mine}
    tied = {name for name, t in mine.items() if name not in tensors and t.data_ptr() in saved_ptrs}
    missing = sorted(set(mine) - set(tensors) - tied)
    extra = sorted(set(tensors) - set(mine))
    if missing or extra:
        raise CheckpointError(f"checkpoint {where}: its tensors do not fit the plain model (missing "
                              f"{missing[:3]}, unknown {extra[:3]})")
    with torch.no_grad():
        for name, t in tensors.items():
            if mine[name].shape != t.shape:
                raise CheckpointError(f"checkpoint {where}: {name} is {tuple(t.shape)}, the model's "
                                      f"{tuple(mine[name].shape)}")
            mine[name].copy_(t)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        model, tokenizer, step = load_model(args.checkpoint)
        ids = tokenizer.encode(args.prompt)
    except (CheckpointError, ValueError) as e:
        print(f"dt sample: error: {e}", file=sys.stderr)
        return 2
    if not ids:
        print("dt sample: error: --prompt is empty: give at least one character", file=sys.stderr)
        return 2
    prompt = torch.tensor([ids[-model.cfg.block_size:]], dtype=torch.int64)  # host: a few ids
    gen = torch.Generator().manual_seed(args.seed)
    print(f"# {args.checkpoint} step {step}, {model.num_params():,} parameters, temperature "
          f"{args.temperature}, top-k {fmt_optional(args.top_k, '- (every token)')}", file=sys.stderr)
    for i in range(args.samples):
        out = model.generate(prompt, args.max_new_tokens, args.temperature, args.top_k, generator=gen)
        if args.samples > 1:
            print(f"--- sample {i + 1}")
        print(args.prompt + tokenizer.decode(out[0, prompt.shape[1]:].tolist()))
    return 0
