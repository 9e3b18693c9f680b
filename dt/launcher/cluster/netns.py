"""The simulated hosts: one network namespace each, a bridge between them, tc on every link.

    host h:  namespace dtc-<job>-h<h>, interface dt<job>n<h>, address 10.77.0.<h+1>/24
             veth pair dt<job>n<h> (inside) <-> dt<job>h<h> (outside, on bridge dtb<job>)

Each host's link is capped in both directions by a token bucket (tc tbf) on
each end of its veth pair: egress inside the namespace is what the host
sends, egress outside is what it receives. A delay (netem) sits in front of
the outside bucket when asked for. Two hosts then talk through two capped
links, as two machines through one switch.

The namespaces share this machine's kernel, so they share /dev/shm too: the
commands run in a private mount namespace with its own /dev/shm (run.py), so
that shared memory between simulated hosts fails as it would between real
ones, and nothing a run leaves there outlives it.

Every name carries the job id, so two runs never collide (the namespaces also
keep their addresses and ports apart), and /run/dt-cluster/<job> records the
owner's pid, so `stale()` finds the leftovers of a run that was killed.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

__all__ = ["SUBNET", "Network", "ClusterError", "check_tools", "create", "destroy", "jobs", "stale"]

SUBNET = "10.77.0"
STATE = "/run/dt-cluster"
_NS_PREFIX = "dtc-"


class ClusterError(RuntimeError):
    """The simulated cluster cannot be made here (not root, no ip/tc, a refused command)."""


@dataclass(frozen=True)
class Network:
    """One job's namespaces and links; everything `destroy` removes."""

    job: str
    hosts: int

    @property
    def bridge(self) -> str:
        return f"dtb{self.job}"

    def namespace(self, h: int) -> str:
        return f"{_NS_PREFIX}{self.job}-h{h}"

    def inside(self, h: int) -> str:
        """The host's interface, inside its namespace (what GLOO_SOCKET_IFNAME names)."""
        return f"dt{self.job}n{h}"

    def outside(self, h: int) -> str:
        return f"dt{self.job}h{h}"

    def address(self, h: int) -> str:
        return f"{SUBNET}.{h + 1}"


def _ip(*args: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise ClusterError(f"`{' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")


def check_tools() -> None:
    """Root and ip/tc, or a one-line reason."""
    if os.geteuid() != 0:
        raise ClusterError("the simulated cluster needs root (network namespaces, bridges, tc)")
    missing = [t for t in ("ip", "tc", "unshare") if shutil.which(t) is None]
    if missing:
        raise ClusterError(f"the simulated cluster needs {' and '.join(missing)} (iproute2, util-linux)")


def _tbf(dev: str, rate_bits: float, netns: str | None = None, delay_s: float = 0.0) -> None:
    """Cap `dev`'s egress at rate_bits per second (and delay it), tbf under an optional netem."""
    tc = ["tc", *(["-n", netns] if netns else []), "qdisc", "add", "dev", dev]
    # The bucket must hold a whole segment the veth may hand it at once (GSO: 64 KiB)
    # and a timer tick's worth of bytes, else tbf drops what it cannot ever send.
    burst = max(int(rate_bits / 8 / 1000), 128 * 1024)
    parent = ["root"]
    if delay_s > 0:
        _ip(*tc, "root", "handle", "1:", "netem", "delay", f"{delay_s * 1e6:.0f}us", "limit", "100000")
        parent = ["parent", "1:1"]
    _ip(*tc, *parent, "handle", "10:", "tbf", "rate", f"{rate_bits:.0f}bit", "burst", str(burst),
        "latency", "100ms")


def create(hosts: int, rate_bits: float | None, delay_s: float = 0.0) -> Network:
    """Make the namespaces, the bridge and the capped links of a new job; undone on failure."""
    check_tools()
    net = Network(secrets.token_hex(3), hosts)
    os.makedirs(STATE, exist_ok=True)
    with open(os.path.join(STATE, net.job), "w") as f:
        f.write(f"{os.getpid()} {hosts}\n")
    try:
        _ip("ip", "link", "add", net.bridge, "type", "bridge")
        _ip("ip", "link", "set", net.bridge, "up")
        for h in range(hosts):
            ns, inside, outside = net.namespace(h), net.inside(h), net.outside(h)
            _ip("ip", "netns", "add", ns)
            _name_service(net, h)
            _ip("ip", "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", ns)
            _ip("ip", "link", "set", outside, "master", net.bridge, "up")
            _ip("ip", "-n", ns, "link", "set", "lo", "up")  # torchrun's workers talk to their agent on it
            _ip("ip", "-n", ns, "addr", "add", f"{net.address(h)}/24", "dev", inside)
            _ip("ip", "-n", ns, "link", "set", inside, "up")
            if rate_bits:
                _tbf(inside, rate_bits, netns=ns)  # what host h sends
                _tbf(outside, rate_bits, delay_s=delay_s)  # what host h receives
            elif delay_s > 0:
                _ip("tc", "qdisc", "add", "dev", outside, "root", "netem", "delay", f"{delay_s * 1e6:.0f}us")
    except BaseException:
        destroy(net.job)
        raise
    return net


def _name_service(net: Network, h: int) -> None:
    """/etc/hosts and resolv.conf of host h (`ip netns exec` mounts /etc/netns/<ns>/* over /etc).

    Inside a namespace this machine's name server is out of reach, and every
    lookup torchrun makes (its own name, its peers') would wait out the
    resolver's timeout, seconds each. Here the hosts are known by name, the
    hostname is the host's own address (as on a real machine), and any other
    lookup fails at once on the namespace's loopback.
    """
    d = f"/etc/netns/{net.namespace(h)}"
    os.makedirs(d, exist_ok=True)
    names = "".join(f"{net.address(i)} dt-host{i}\n" for i in range(net.hosts))
    with open(f"{d}/hosts", "w") as f:
        f.write(f"127.0.0.1 localhost\n{net.address(h)} {socket.gethostname()}\n{names}")
    with open(f"{d}/resolv.conf", "w") as f:
        f.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")


def _kill_inside(ns: str) -> None:
    """SIGKILL whatever still runs in namespace `ns` (a worker that escaped its group)."""
    for _ in range(3):
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        if not out:
            return
        for pid in out:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.2)


def destroy(job: str) -> None:
    """Remove every trace of `job`: its processes, veths, namespaces, bridge and state file.

    Quiet about what is already gone, so it can run after a partial create or twice.
    """
    for ns in _namespaces():
        if ns.startswith(f"{_NS_PREFIX}{job}-h"):
            _kill_inside(ns)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for name in re.findall(rf"^\d+: (dt(?:b|){job}(?:h\d+)?)[@:]", links, re.M):
        # deleting the outside end deletes its pair now; a namespace's own removal
        # frees its end only later, asynchronously
        subprocess.run(["ip", "link", "del", name], capture_output=True)
    for ns in _namespaces():
        if ns.startswith(f"{_NS_PREFIX}{job}-h"):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for ns in _configured():
        if ns.startswith(f"{_NS_PREFIX}{job}-h"):
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(STATE, job))


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _configured() -> list[str]:
    """Namespaces with files in /etc/netns (left if a run was killed mid-teardown)."""
    return os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []


def jobs() -> list[str]:
    """Every job with something left: a namespace, its files, a link or a state file."""
    found = {ns[len(_NS_PREFIX):].rpartition("-h")[0] for ns in _namespaces() + _configured()
             if ns.startswith(_NS_PREFIX)}
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found |= set(re.findall(r"^\d+: dtb([0-9a-f]{6})[@:]", links, re.M))
    if os.path.isdir(STATE):
        found |= set(os.listdir(STATE))
    return sorted(found)


def _owner_alive(job: str) -> bool:
    try:
        with open(os.path.join(STATE, job)) as f:
            pid = int(f.read().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def stale() -> list[str]:
    """Jobs whose owner is gone (killed before it could tear down)."""
    return [j for j in jobs() if not _owner_alive(j)]
