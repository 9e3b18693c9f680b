"""`dt train` under torchrun, with one worker that dies by SIGKILL at a chosen step (first attempt only).

Used by tests/test_checkpoints.py: DT_TEST_KILL_RANK and DT_TEST_KILL_STEP say which rank
dies when it asks for which step's batch; torchrun (--max-restarts) restarts the group, and
`dt train` must resume from the last good checkpoint. Not collected by pytest (no test_ prefix).
"""

import os
import signal
import sys

from dt.models.data import CharData
from dt.train.cli import main

if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and \
        os.environ.get("RANK") == os.environ["DT_TEST_KILL_RANK"]:
    kill_at = int(os.environ["DT_TEST_KILL_STEP"])
    batch = CharData.batch

    def batch_or_die(self: CharData, step: int, *args: int) -> object:
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return batch(self, step, *args)

    CharData.batch = batch_or_die  # type: ignore[method-assign]

sys.exit(main())
