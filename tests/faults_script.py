"""A rank program for tests/test_faults_launched.py, run by torchrun: `faults_script.py DIR MODE [RANK]`.

Every rank writes DIR/<rank>.pid first. MODE:
- park: every rank sleeps (the test kills torchrun itself);
- hang RANK: that rank sleeps in its own compute, the others all-reduce (DT_TIMEOUT ends their wait).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import dt
from dt.launcher import open_world, run_command


def _job(directory: str, mode: str, hung: int) -> list[float]:
    Path(directory, f"{dist.get_rank()}.pid").write_text(f"{os.getpid()}\n")
    if mode == "park" or dist.get_rank() == hung:
        time.sleep(600)
    x = torch.ones(4)
    dt.all_reduce(x)
    return x.tolist()


def main(argv: list[str]) -> int:
    directory, mode = argv[0], argv[1]
    hung = int(argv[2]) if len(argv) > 2 else -1
    with open_world(int(os.environ["WORLD_SIZE"])) as world:
        world.run(_job, directory, mode, hung, timeout=300)
    return 0


if __name__ == "__main__":
    sys.exit(run_command("faults_script", main, sys.argv[1:]))
