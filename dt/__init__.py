"""dt: distributed training from point-to-point send/recv up.

    import dt
    dt.all_reduce(tensor)                 # ring / naive / ... written in dt.collectives
    with dt.traffic() as t: ...           # bytes and messages this rank moved
"""

from dt.collectives import *  # noqa: F401,F403
from dt.collectives import __all__ as _collectives_all
from dt.mesh import mesh  # dt.mesh(dp=, tp=, pp=): the 3D process grid
from dt.transport import (
    CollectiveError,
    CollectiveTimeout,
    Work,
    set_timeout,
    set_validation,
    traffic,
)

__version__ = "0.1.0"

__all__ = [
    *_collectives_all,
    "CollectiveError",
    "CollectiveTimeout",
    "Work",
    "set_timeout",
    "set_validation",
    "traffic",
    "mesh",
]
