"""`python -m dt.train` (and `torchrun -m dt.train`): the same as `dt train`."""

import sys

from dt.train.cli import main

sys.exit(main())
