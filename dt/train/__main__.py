"""`python -m dt.train` (and `torchrun -m dt.train`): the same as `dt train`."""

import sys

from dt.launcher import run_command
from dt.train.cli import main

sys.exit(run_command("dt train", main, sys.argv[1:]))
