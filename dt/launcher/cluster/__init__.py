"""A simulated cluster on one machine: hosts as network namespaces, links capped by tc.

    with cluster(hosts=2, per_host=2, link_bits=1e9) as c:   # or: dt cluster up --hosts 2 ...
        status = c.run(["python", "-m", "dt", "bench", "collectives"])

netns.py makes the hosts (a namespace each, a bridge, veth pairs, tbf on both
ends), run.py runs a command on every host under torchrun and tears it all
down however the run ends, launch.py runs a function on every rank of a fresh
cluster and brings each rank's result back (`cluster_launch`, for `dt plan
--check` across hosts; imported from its own module, which every host runs as
__main__). Root, `ip`, `tc` and `unshare` are needed; without them
`netns.check_tools` says which is missing.
"""

from dt.launcher.cluster.netns import ClusterError, Network, check_tools, destroy, jobs, stale
from dt.launcher.cluster.run import SimulatedCluster, cluster

__all__ = ["ClusterError", "Network", "SimulatedCluster", "check_tools", "cluster", "destroy", "jobs",
           "stale"]
