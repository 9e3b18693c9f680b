"""`dt train`: train the small GPT on a dp x tp x pp mesh of local processes.

    dt train --dp 2 --tp 2 --pp 2 --steps 100
    dt train --pp 4 --micro-batches 8 --schedule gpipe --checkpoint ckpt.pt   # resumes if it exists
    dt train --pp 2 --schedule interleaved --virtual 2                       # 2 chunks per stage
    torchrun --nproc-per-node 8 -m dt.train --dp 2 --tp 2 --pp 2 --threads 1 # same code, torchrun

Spawns dp*tp*pp processes (dt.launcher.launch), builds the mesh
(dt.mesh), the model (dt.model.ParallelGPT) and trains on the generated text
(dt.data). Every data-parallel rank takes its slice of the same global batch,
so the loss curve does not depend on the mesh. Rank 0 shows a progress bar and
prints, at the end, the loss, tokens/s and where the time went:

    compute        forward and backward of this rank's layers (and the optimizer)
    communication  tensor-parallel collectives + the data-parallel gradient all-reduce
    bubble         waiting on the pipeline neighbours (idle slots, plus the wire)

--checkpoint PATH saves every rank's model and optimizer shards into one file
at the end (and every --save-every steps), atomically: written to PATH.tmp and
moved over PATH with os.replace, so a crash never leaves half a checkpoint. A
run started with an existing PATH resumes from it (same mesh and model). Rank 0
writes the file and every rank reads it: one machine, or a shared filesystem.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from typing import Any

import torch

from dt import transport
from dt.collectives import barrier
from dt.launcher import launch
from dt.models.data import CharData
from dt.models.gpt import GPTConfig, ParallelGPT
from dt.parallel.mesh import mesh as build_mesh
from dt.parallel.pipeline import bubble_fraction

__all__ = ["load_checkpoint", "main", "save_checkpoint", "train_worker"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dt train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp", type=int, default=1, help="data-parallel size")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=16, help="global batch (sequences)")
    p.add_argument("--block-size", type=int, default=32, help="sequence length")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="per pipeline step (default: 2 * pp, capped at the per-rank batch)")
    p.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved"], default="1f1b")
    p.add_argument("--virtual", type=int, default=1,
                   help="model chunks per pipeline stage (with --schedule interleaved)")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--untied", action="store_true", help="separate output projection")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--checkpoint", default=None, metavar="PATH", help="save here; resume if it exists")
    p.add_argument("--save-every", type=int, default=0, help="also checkpoint every N steps")
    p.add_argument("--validate", action="store_true",
                   help="keep dt's cross-rank argument check on (off by default: it costs a "
                        "small all-gather per collective)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per process (default: the launcher's cores // processes; "
                        "on a busy machine 1 avoids OpenMP threads spinning against each other)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    per_rank = args.batch_size // args.dp
    if args.batch_size % args.dp or per_rank < 1:
        p.error(f"--batch-size {args.batch_size} must be a positive multiple of --dp {args.dp}")
    if args.micro_batches is None:
        args.micro_batches = min(2 * args.pp, per_rank)
    if not 1 <= args.micro_batches <= per_rank:
        p.error(f"--micro-batches must be between 1 and the per-rank batch {per_rank}")
    if args.virtual > 1 and args.schedule != "interleaved":
        p.error("--virtual > 1 needs --schedule interleaved")
    if args.n_layer + 2 < args.pp * args.virtual:
        p.error(f"{args.n_layer} blocks + embedding + head cannot fill {args.pp} stages "
                f"x {args.virtual} chunks")
    if args.n_head % args.tp:
        p.error(f"--n-head {args.n_head} must be divisible by --tp {args.tp}")
    return args


class Adam:
    """Adam (Kingma & Ba), written out: torch.optim's first use imports torch._dynamo,
    seconds per process, which every spawned rank would pay at once on a small box.

    State per parameter: two moments of its shape (8 bytes per float32 parameter
    on top of the parameter and its gradient). Each rank updates only its own
    shard: after the gradient all-reduce every replica takes the same step.
    """

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            m_hat, v_hat = m / (1 - b1 ** self.t), v / (1 - b2 ** self.t)
            p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "m": self.m, "v": self.v}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = state["t"]
        for mine, saved in zip(self.m + self.v, state["m"] + state["v"]):
            mine.copy_(saved)


# --------------------------------------------------------------------------
# Checkpoint: every rank's shard in one file, written atomically by rank 0.
# --------------------------------------------------------------------------


def _to_bytes(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def save_checkpoint(path: str, model: ParallelGPT, optimizer: Adam,
                    step: int) -> None:
    """Collective: rank 0 receives each rank's serialised shard and writes one file.

    Cost: every rank sends its model + optimizer state to rank 0 (point to
    point, a length first); rank 0 receives world-1 of them in rank order.
    """
    me, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    mine = _to_bytes({"model": model.stage.state_dict(), "optimizer": optimizer.state_dict(),
                      "step": step, "coords": model.mesh.coords()})
    if me != 0:
        transport.send(torch.tensor([mine.numel()], dtype=torch.int64), 0)
        transport.send(mine, 0)
    else:
        shards = [bytes(mine.numpy())]
        for r in range(1, world):
            n = torch.empty(1, dtype=torch.int64)
            transport.recv(n, r)
            data = torch.empty(int(n), dtype=torch.uint8)
            transport.recv(data, r)
            shards.append(bytes(data.numpy()))
        m = model.mesh
        state = {"step": step, "mesh": {"dp": m.dp, "tp": m.tp, "pp": m.pp},
                 "config": model.cfg.as_dict(), "ranks": shards}
        tmp = f"{path}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic: readers see the old file or the new one, never half
    barrier()  # nobody returns before the file is complete


def load_checkpoint(path: str, model: ParallelGPT, optimizer: Adam) -> int:
    """Load this rank's shard; returns the step to continue from."""
    state = torch.load(path, weights_only=False)
    m = model.mesh
    if state["mesh"] != {"dp": m.dp, "tp": m.tp, "pp": m.pp} or state["config"] != model.cfg.as_dict():
        raise ValueError(f"checkpoint {path} is for mesh {state['mesh']} and model "
                         f"{state['config']}, not this run's")
    mine = torch.load(io.BytesIO(state["ranks"][m.rank]), weights_only=False)
    model.stage.load_state_dict(mine["model"])
    optimizer.load_state_dict(mine["optimizer"])
    return int(state["step"])


# --------------------------------------------------------------------------
# The worker: one rank of the mesh.
# --------------------------------------------------------------------------


def make_model(args: argparse.Namespace, vocab_size: int) -> tuple[ParallelGPT, Adam]:
    mesh = build_mesh(dp=args.dp, tp=args.tp, pp=args.pp)
    cfg = GPTConfig(vocab_size=vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd, tied=not args.untied, seed=args.seed,
                    dtype=args.dtype)
    model = ParallelGPT(cfg, mesh, micro_batches=args.micro_batches, schedule=args.schedule,
                        virtual=args.virtual)
    optimizer = Adam(model.stage.parameters(), lr=args.lr)
    return model, optimizer


def train_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Train on this rank; returns the losses, throughput and time split."""
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _train(args)
    finally:
        torch.set_num_threads(threads)  # a reused worker (tests) gets its setting back


def _train(args: argparse.Namespace) -> dict[str, Any]:
    transport.set_validation(args.validate)
    data = CharData(seed=args.seed)
    model, optimizer = make_model(args, data.vocab_size)
    m = model.mesh
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        start = load_checkpoint(args.checkpoint, model, optimizer)
    per_rank = args.batch_size // args.dp
    bar = None
    if m.rank == 0 and not args.no_progress:
        from tqdm import tqdm
        bar = tqdm(total=args.steps, initial=start, desc=f"dp{m.dp} tp{m.tp} pp{m.pp}",
                   unit="step", file=sys.stdout)
    losses: list[float] = []
    t_opt = 0.0
    t_start = time.perf_counter()
    for step in range(start, args.steps):
        x, y = data.batch(step, args.batch_size, args.block_size)
        sl = slice(m.dp_rank * per_rank, (m.dp_rank + 1) * per_rank)
        optimizer.zero_grad()
        loss = model.train_step(x[sl], y[sl])
        t0 = time.perf_counter()
        optimizer.step()
        t_opt += time.perf_counter() - t0
        losses.append(loss)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}")
        if args.checkpoint and args.save_every and (step + 1) % args.save_every == 0:
            save_checkpoint(args.checkpoint, model, optimizer, step + 1)
    wall = time.perf_counter() - t_start
    if bar is not None:
        bar.close()
    if args.checkpoint and start < args.steps:
        save_checkpoint(args.checkpoint, model, optimizer, args.steps)
    steps = args.steps - start
    times = dict(model.times)
    times["compute"] += t_opt
    return {"rank": m.rank, "coords": m.coords(), "losses": losses, "start": start, "wall_s": wall,
            "tokens_per_s": steps * args.batch_size * args.block_size / wall if wall > 0 else 0.0,
            "times": times, "bytes_sent": dict(model.bytes_sent), "steps": steps,
            "peak_stash": model.pipe.stats.peak_stash}


def report(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    r0 = results[0]
    if not r0["losses"]:
        return f"nothing to do: the checkpoint is already at step {r0['start']}"
    chunks = f" x {args.virtual} chunks" if args.virtual > 1 else ""
    lines = [f"mesh dp={args.dp} tp={args.tp} pp={args.pp} ({args.dp * args.tp * args.pp} processes), "
             f"{args.schedule}{chunks}, {args.micro_batches} micro-batches, global batch "
             f"{args.batch_size} x {args.block_size} tokens",
             f"steps {r0['start']}..{r0['start'] + len(r0['losses'])}: loss "
             f"{r0['losses'][0]:.4f} -> {r0['losses'][-1]:.4f}",
             f"throughput {r0['tokens_per_s']:.0f} tokens/s ({r0['wall_s']:.2f} s)",
             f"time split, mean over {len(results)} rank(s) (share of the training loop's wall time):"]
    for key in ("compute", "communication", "bubble"):
        mean = sum(r["times"][key] for r in results) / len(results)
        lines.append(f"  {key:<14} {mean:7.2f} s  {100 * mean / r0['wall_s']:5.1f}%")
    per_step = {k: sum(r["bytes_sent"][k] for r in results) / len(results) / r0["steps"]
                for k in r0["bytes_sent"]}
    lines.append(f"bytes sent per rank per step (mean over {len(results)} rank(s)): " + ", ".join(
        f"{k} {v / 1e3:.1f} kB" for k, v in per_step.items()))
    if args.pp > 1:
        per_stage = []
        for s in range(args.pp):
            mine = [r["times"]["bubble"] / r["wall_s"] for r in results if r["coords"][2] == s]
            per_stage.append(f"{100 * sum(mine) / len(mine):.0f}%" if mine else "?")
        lines.append(f"pipeline bubble (idle / loop time) by stage: {', '.join(per_stage)}; "
                     f"(p-1)/(v*m+p-1) = "
                     f"{100 * bubble_fraction(args.pp, args.micro_batches, args.virtual):.1f}%; "
                     f"peak stashed (chunk, micro-batch) activations on stage 0: {r0['peak_stash']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    world = args.dp * args.tp * args.pp
    results = launch(train_worker, world, args)
    if results and results[0]["rank"] == 0:
        print(report(args, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
