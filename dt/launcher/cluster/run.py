"""Run one command on every simulated host with torchrun, as on real machines.

    with cluster(hosts=2, per_host=2, link_bits=1e9) as c:
        code = c.run(["python", "-m", "dt", "bench", "collectives"])

Host h runs, inside its namespace (netns.py) and a private /dev/shm:

    GLOO_SOCKET_IFNAME=<its interface> torchrun --nnodes H --nproc-per-node G --node-rank h \\
        --master-addr 10.77.0.1 --master-port 29500 --local-addr 10.77.0.<h+1> CMD...

which is what one types on real hosts (see /work/notes/across_machines.md):
torchrun and torch.distributed do the rendezvous, dt adds nothing of its own.
GLOO_SOCKET_IFNAME pins gloo to the host's link (it otherwise picks the
address the hostname resolves to, which every namespace shares). DT_HOST is
removed, so dt finds which ranks share a host from torchrun's node identity.

Each host's output comes back line by line, prefixed "[h<h>]". The run's
status is the worst host's; once a host fails the others get a short grace,
then are stopped (a surviving host would otherwise wait on the dead one for
torchrun's rendezvous timeout). Everything is torn down on the way out:
normal exit, exception, Ctrl-C, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO

from dt.launcher.cluster import netns
from dt.launcher.pool import signals_raise_terminated

__all__ = ["SimulatedCluster", "cluster"]

MASTER_PORT = 29500  # fixed: every job has namespaces of its own, so no two runs share a port
_FAIL_GRACE_S = 10.0  # after one host fails, how long the others get to end by themselves
_STOP_GRACE_S = 5.0  # after SIGTERM, how long torchrun gets to stop its workers


def _status(code: int) -> int:
    """A shell's exit status: a death by signal s reads 128 + s."""
    return 128 - code if code < 0 else code


class SimulatedCluster:
    """A live simulated cluster: `run` a command on every host."""

    def __init__(self, net: netns.Network, per_host: int):
        self.net = net
        self.hosts = net.hosts
        self.per_host = per_host
        self._procs: list[subprocess.Popen[bytes]] = []

    def command(self, h: int, cmd: Sequence[str]) -> list[str]:
        """Host h's command line: torchrun inside its namespace, with a /dev/shm of its own."""
        script = list(cmd)
        plain = not script[0].endswith(".py")  # torchrun runs a .py with python, anything else as is
        torchrun = [sys.executable, "-m", "torch.distributed.run",
                    "--nnodes", str(self.hosts), "--nproc-per-node", str(self.per_host),
                    "--node-rank", str(h), "--master-addr", self.net.address(0),
                    "--master-port", str(MASTER_PORT), "--local-addr", self.net.address(h),
                    *(["--no-python"] if plain else []), *script]
        private_shm = "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec \"$@\""
        return ["ip", "netns", "exec", self.net.namespace(h), "unshare", "--mount", "--propagation",
                "private", "sh", "-c", private_shm, f"dt-host{h}", *torchrun]

    def env(self, h: int, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("DT_HOST", None)
        env["GLOO_SOCKET_IFNAME"] = self.net.inside(h)
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default, without its banner
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # namespaces have no hostname to resolve: noise
        env.update(extra or {})
        return env

    def run(self, cmd: Sequence[str], out: IO[str] | None = None, env: dict[str, str] | None = None,
            timeout: float | None = None) -> int:
        """CMD on every host at once; the worst host's exit status (124 if `timeout` passed)."""
        if not cmd:
            raise ValueError("no command to run")
        out = out or sys.stdout
        lock = threading.Lock()
        self._procs = [subprocess.Popen(self.command(h, cmd), env=self.env(h, env), stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)  # ours to stop, not the terminal's
                       for h in range(self.hosts)]
        readers = [threading.Thread(target=_relay, args=(p.stdout, f"[h{h}] ", out, lock), daemon=True)
                   for h, p in enumerate(self._procs)]
        for t in readers:
            t.start()
        try:
            timed_out = self._wait(timeout)
        finally:
            self.stop()
            for t in readers:
                t.join(2.0)
        codes = [_status(p.returncode if p.returncode is not None else -signal.SIGKILL) for p in self._procs]
        return 124 if timed_out else max(codes)

    def _wait(self, timeout: float | None) -> bool:
        """Until every host has ended, or one failed and the grace passed; True if timed out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        failed_at = None
        while None in [p.poll() for p in self._procs]:  # a list: every host polled, each round
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return True
            if failed_at is None and any(p.returncode not in (None, 0) for p in self._procs):
                failed_at = now
            if failed_at is not None and now - failed_at >= _FAIL_GRACE_S:
                return False
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """SIGTERM each host's torchrun (which stops its workers), SIGKILL what is left."""
        live = [p for p in self._procs if p.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for p in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(_STOP_GRACE_S)


def _relay(stream: IO[bytes], prefix: str, out: IO[str], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        with lock:
            out.write(prefix + raw.decode(errors="replace"))
            out.flush()
    stream.close()


@contextlib.contextmanager
def cluster(hosts: int, per_host: int, link_bits: float | None = None,
            delay_s: float = 0.0) -> Iterator[SimulatedCluster]:
    """`hosts` namespaces of `per_host` ranks each, links capped at link_bits/s; gone on exit."""
    if hosts < 1 or per_host < 1:
        raise ValueError(f"hosts and per_host must be at least 1, got {hosts} x {per_host}")
    with signals_raise_terminated(override=True):  # teardown runs whatever handler was there
        net = netns.create(hosts, link_bits, delay_s)
        c = SimulatedCluster(net, per_host)
        try:
            yield c
        finally:
            # a second Ctrl-C or SIGTERM mid-teardown must not leave half a cluster
            stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            main = threading.current_thread() is threading.main_thread()
            old = {s: signal.signal(s, signal.SIG_IGN) for s in stops} if main else {}
            try:
                c.stop()
                netns.destroy(net.job)
            finally:
                for s, h in old.items():
                    signal.signal(s, h)
