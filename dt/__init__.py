"""dt: distributed training from point-to-point send/recv up.

    import dt
    dt.all_reduce(tensor)                 # ring / naive / one_shot ... written in dt.collectives
    buf = dt.shm_empty(n, group=g)        # a tensor peers on this host read in place
    with dt.traffic() as t: ...           # bytes and messages this rank moved
    m = dt.mesh(dp=2, tp=2, pp=2)         # the process grid (dt.parallel.mesh)
    m = dt.mesh(dp=2, cp=2, ep=2, tp=2)   # + context and expert parallel

The layers, bottom up (each imports only from the ones above it in this list):
dt.layout (index arithmetic), dt.cost (what things cost), dt.transport (the
wire), dt.launcher, dt.collectives, dt.backend (dt as torch.distributed's
backend "dt"), dt.parallel, dt.models, dt.train, and the tools on top
(dt.tools, dt.bench).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

from dt.backend import ProcessGroup  # registers the torch.distributed backend "dt"
from dt.collectives import *  # noqa: F401,F403
from dt.collectives import __all__ as _collectives_all
from dt.parallel.grid import Grid
from dt.parallel.mesh import Mesh, mesh
from dt.parallel.plan import parallelize
from dt.transport import (
    CollectiveError,
    CollectiveTimeout,
    Work,
    set_timeout,
    set_transport,
    set_validation,
    traffic,
)

__version__ = "0.2.0"

__all__ = [
    *_collectives_all,
    "CollectiveError",
    "CollectiveTimeout",
    "Grid",
    "Mesh",
    "ProcessGroup",
    "Work",
    "mesh",
    "parallelize",
    "set_timeout",
    "set_transport",
    "set_validation",
    "traffic",
]

# Modules that moved when the package grew rooms, by their old names: code
# written against the old paths (`from dt.data_parallel import ...`) keeps
# working, and gets the very same module object as the new path.
MOVED = {
    "dt.cost_model": "dt.cost",
    "dt.data_parallel": "dt.parallel.data_parallel",
    "dt.zero": "dt.parallel.zero",
    "dt.tensor_parallel": "dt.parallel.tensor",
    "dt.pipeline": "dt.parallel.pipeline",
    "dt.model": "dt.models.gpt",
    "dt.models.nanogpt": "dt.models.gpt",
    "dt.data": "dt.models.data",
    "dt.tune": "dt.tools.tune",
    "dt.whatif": "dt.tools.whatif",
    "dt.demo": "dt.tools.demo",
    "dt.cli": "dt.tools.cli",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import an old module name as the module it moved to."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):  # noqa: ANN201
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        pass

    def get_code(self, fullname: str):  # noqa: ANN201  (`python -m dt.cli` runs the new module)
        target = importlib.util.find_spec(MOVED[fullname])
        return target.loader.get_code(target.name)


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())
