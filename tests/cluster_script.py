"""Run by tests/test_cluster.py on every simulated host under torchrun: `cluster_script.py HOSTS PER_HOST`.

Checks that dt sees the hosts torchrun made (each host's ranks together,
found from torchrun's node identity), and that dt's all-reduce across them
matches torch's. Prints one "cluster-ok" line per rank.
"""

import os
import sys

import torch
import torch.distributed as dist

import dt
from dt.launcher import init
from dt.transport.connect import topology_of
from dt.transport.group import resolve_group

hosts, per_host = int(sys.argv[1]), int(sys.argv[2])
assert "DT_HOST" not in os.environ, "the cluster must leave host detection to torchrun"
init("gloo", timeout=60)
rank = dist.get_rank()
topo = topology_of(resolve_group(None))
expected = tuple(r // per_host for r in range(hosts * per_host))  # torchrun: node h has ranks h*G..h*G+G-1
assert topo.hosts == expected, f"rank {rank}: hosts {topo.hosts}, expected {expected}"
for n in (1, 1000, 65537):
    torch.manual_seed(rank * 7 + n)
    x = torch.randn(n)
    mine, ref = x.clone(), x.clone()
    dt.all_reduce(mine)
    dist.all_reduce(ref)  # the reference only
    assert torch.allclose(mine, ref, rtol=1e-5, atol=1e-5), f"rank {rank}: all_reduce of {n} differs"
dist.barrier()
# One write per line: print() writes the text and its newline apart, and two ranks of a host
# share the pipe, so under load one rank's line could land between another's text and newline.
sys.stdout.write(f"cluster-ok rank {rank} hosts {list(topo.hosts)}\n")
sys.stdout.flush()
dist.destroy_process_group()
