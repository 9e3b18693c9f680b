"""A rank program for tests/test_faults_launched.py, run by torchrun: `faults_script.py DIR MODE [RANK]`.

Every rank writes DIR/<rank>.pid first. MODE:
- park: every rank sleeps (the test kills torchrun itself);
- hang RANK: that rank sleeps in its own compute, the others all-reduce (DT_TIMEOUT ends their wait);
- hang-connected RANK: the same after one all-reduce of every rank (the group is connected: on
  one host its wire is shared memory);
- ddp RANK: torch's DDP on a small model over the "dt" backend, as a user writes it (no dt
  launcher); that rank SIGKILLs itself at step 5, and each survivor writes what it raised to
  DIR/<rank>.error (the time, then the error) and exits with code 1.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import dt
from dt.launcher import open_world, run_command


def _job(directory: str, mode: str, hung: int) -> list[float]:
    Path(directory, f"{dist.get_rank()}.pid").write_text(f"{os.getpid()}\n")
    if mode == "hang-connected":
        dt.all_reduce(torch.ones(4))
    if mode == "park" or dist.get_rank() == hung:
        time.sleep(600)
    x = torch.ones(4)
    dt.all_reduce(x)
    return x.tolist()


def _ddp_until_a_peer_dies(directory: str, victim: int) -> int:
    dist.init_process_group("dt")
    rank = dist.get_rank()
    Path(directory, f"{rank}.pid").write_text(f"{os.getpid()}\n")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10_000):  # a survivor's next backward after step 5 fails
        if step == 5 and rank == victim:
            Path(directory, "killed").write_text(f"{time.time()}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            model(torch.randn(32, 64)).pow(2).mean().backward()
        except Exception as exc:  # noqa: BLE001 - what the survivor heard, for the test to read
            Path(directory, f"{rank}.error").write_text(f"{time.time()}\n{type(exc).__name__}: {exc}")
            return 1
        optimizer.step()
        optimizer.zero_grad()
    return 0


def main(argv: list[str]) -> int:
    directory, mode = argv[0], argv[1]
    hung = int(argv[2]) if len(argv) > 2 else -1
    if mode == "ddp":
        return _ddp_until_a_peer_dies(directory, hung)
    with open_world(int(os.environ["WORLD_SIZE"])) as world:
        world.run(_job, directory, mode, hung, timeout=300)
    return 0


if __name__ == "__main__":
    sys.exit(run_command("faults_script", main, sys.argv[1:]))
