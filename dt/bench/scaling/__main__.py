"""`python -m dt.bench.scaling` = `dt bench scaling`."""

import sys

# Import by name, not as __main__, so the workers' functions pickle by a name every
# worker process can import (they live in dt.bench.scaling.workers).
from dt.bench.scaling.cli import main
from dt.launcher import run_command

sys.exit(run_command("dt bench scaling", main, sys.argv[1:]))
