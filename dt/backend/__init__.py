"""dt as a torch.distributed backend, so torch code runs dt's algorithms unchanged.

    import dt                                  # registers the backend "dt"
    dist.init_process_group("dt")              # every dist.* call now runs dt's collectives
    group = dist.new_group(backend="dt")       # or only on one group

`import dt` registers "dt" with torch.distributed.Backend.register_backend
(for CPU tensors: its wire is gloo). What then runs on it unchanged, and
what does not, is measured in tests/test_backend.py and listed in the README.
"""

import torch.distributed as dist

from dt.backend.process_group import ProcessGroup, create

__all__ = ["BACKEND", "ProcessGroup", "create"]

BACKEND = "dt"

dist.Backend.register_backend(BACKEND, create, devices=["cpu"])
