"""N broker processes, each in its own network namespace (needs root).

Topology (no bridge, no iptables: only `ip`):

```
            router namespace qx{tag}r (ip_forward=1)
   r0 10.79.0.1/24    r1 10.79.1.1/24   ...   r{N-1}
      |                  |
   c0 10.79.0.2       c0 10.79.1.2            cluster links (peer traffic)
   node ns qx{tag}n0  node ns qx{tag}n1  ...
   a0 10.80.S.2       a0 10.80.S.6                client links, point to point
      |                  |
   qx{tag}a0 10.80.S.1  qx{tag}a1 10.80.S.5  (root namespace: clients, HTTP)
```

Peer traffic between two nodes is forwarded by the router namespace, so a
cut from node i to node j is one policy rule there,
`ip rule add from 10.79.i.2 to 10.79.j.2 blackhole`: packets are dropped
silently (like iptables DROP), one direction at a time, so halves, rings,
bridges, isolations and one-way cuts are all sets of (src, dst) pairs. The
client links never go through the router: clients can always reach every
live node, including one cut off from its peers (they see the minority side,
as in Jepsen).

Names start with `qx` (tests/cluster/test_partition.py uses `qq`), the tag
holds this process's pid, and the client subnet 10.80.S.0/24 is one no
interface in the root namespace uses yet, so several runs (and
test_partition.py) can share a machine. `remove_leftovers()` deletes only
namespaces and links of this naming scheme whose pid is dead, and kills the
processes still inside those namespaces.
"""
from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from tests.e2e.broker_proc import BrokerProcess, in_parallel, start_all

AMQP_PORT = 5672
MGMT_PORT = 15672
CLUSTER_PORT = 25672
_SEQ = itertools.count()
_NAME_RE = re.compile(r"^qx(\d+)k\d+(?:r|n\d+)$")
_LINK_RE = re.compile(r"^\d+: (qx(\d+)k\d+a\d+)[@:]", re.M)


def sh(*args: str, input: str | None = None) -> None:
    r = subprocess.run(args, capture_output=True, text=True, input=input)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> list[str]:
    """Delete namespaces and root links of earlier runs (this naming scheme
    only) whose owning process is gone; kill what still runs inside them."""
    removed: list[str] = []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME_RE.match(name)
        if not m or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue  # not ours, or its run is still going
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
        for p in pids.split():
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        removed.append(name)
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        mounts = []
    for line in mounts:
        parts = line.split()
        m = re.search(r"/qxchaos-(\d+)-", parts[1]) if len(parts) > 1 else None
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            subprocess.run(["umount", "-l", parts[1]], capture_output=True)
            removed.append(parts[1])
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for m in _LINK_RE.finditer(out):
        if not _pid_alive(int(m.group(2))):
            subprocess.run(["ip", "link", "del", m.group(1)], capture_output=True)
            removed.append(m.group(1))
    return removed


def _free_client_slot() -> int:
    out = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    used = {int(m) for m in re.findall(r"inet 10\.80\.(\d+)\.", out)}
    start = os.getpid() % 200
    for k in range(250):
        s = (start + k) % 250
        if s not in used:
            return s
    raise RuntimeError("no free 10.80.S.0/24 client subnet")


class ChaosNet:
    """The namespaces and links of one cluster, and the cuts between nodes."""

    def __init__(self, n: int) -> None:
        if n < 1 or n > 60:
            raise ValueError("1..60 nodes")
        self.n = n
        self.tag = f"{os.getpid()}k{next(_SEQ)}"
        self.router = f"qx{self.tag}r"
        self.ns = [f"qx{self.tag}n{i}" for i in range(n)]
        self.slot = -1
        self.blocked: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._up = False

    # addresses
    def cluster_ip(self, i: int) -> str:
        return f"10.79.{i}.2"

    def client_ip(self, i: int) -> str:
        return f"10.80.{self.slot}.{4 * i + 2}"

    def alink(self, i: int) -> str:
        return f"qx{self.tag}a{i}"

    def setup(self) -> None:
        remove_leftovers()
        self.slot = _free_client_slot()
        self._up = True
        r = self.router
        sh("ip", "netns", "add", r)
        sh("ip", "-n", r, "link", "set", "lo", "up")
        sh("ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for i, ns in enumerate(self.ns):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", r, "link", "add", f"r{i}", "type", "veth", "peer", "name", "c0", "netns", ns)
            sh("ip", "-n", r, "addr", "add", f"10.79.{i}.1/24", "dev", f"r{i}")
            sh("ip", "-n", r, "link", "set", f"r{i}", "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.cluster_ip(i)}/24", "dev", "c0")
            sh("ip", "-n", ns, "link", "set", "c0", "up")
            sh("ip", "-n", ns, "route", "add", "10.79.0.0/16", "via", f"10.79.{i}.1")
            a = self.alink(i)
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", "a0", "netns", ns)
            sh("ip", "addr", "add", f"10.80.{self.slot}.{4 * i + 1}/30", "dev", a)
            sh("ip", "link", "set", a, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.client_ip(i)}/30", "dev", "a0")
            sh("ip", "-n", ns, "link", "set", "a0", "up")

    # cuts
    def set_blocked(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Make exactly `pairs` (src, dst) cut: packets from src's cluster
        address to dst's are dropped by the router."""
        want = {(a, b) for a, b in pairs if a != b}
        with self._lock:
            lines = [f"rule del from {self.cluster_ip(a)} to {self.cluster_ip(b)} priority 100 blackhole"
                     for a, b in sorted(self.blocked - want)]
            lines += [f"rule add from {self.cluster_ip(a)} to {self.cluster_ip(b)} priority 100 blackhole"
                      for a, b in sorted(want - self.blocked)]
            if lines:
                sh("ip", "-n", self.router, "-batch", "-", input="\n".join(lines) + "\n")
            self.blocked = want

    def heal(self) -> None:
        self.set_blocked(())

    def teardown(self) -> None:
        if not self._up:
            return
        for ns in [*self.ns, self.router]:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
            for p in pids.split():
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for i, ns in enumerate(self.ns):
            subprocess.run(["ip", "link", "del", self.alink(i)], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.router], capture_output=True)
        self._up = False


class ChaosCluster:
    """N brokers over a ChaosNet, each with its management API on, plus the
    process-level faults (kill -9, restart, SIGSTOP/SIGCONT)."""

    def __init__(self, base: Path, n: int, extra_config: str = "",
                 tmpfs_node: int | None = None, tmpfs_mb: int = 64) -> None:
        self.base = base
        # one node's data directory on a small tmpfs, for the disk-full fault
        self.tmpfs_node = tmpfs_node
        self.tmpfs_mb = tmpfs_mb
        self.mounted: list[Path] = []
        self.net = ChaosNet(n)
        self.n = n
        self.extra_config = extra_config
        self.nodes: list[BrokerProcess] = []
        self.paused: set[int] = set()
        self.down: set[int] = set()
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return [f"rabbit-{i}@{self.net.cluster_ip(i)}" for i in range(self.n)]

    def start(self, timeout: float = 120.0) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.net.setup()
        secret = self.base / "secret"
        secret.write_text("chaos-test-secret-0123456789abcdef\n")
        names = self.names()
        seeds = "".join(f"cluster.seeds.{i + 1} = {nm}:{CLUSTER_PORT}\n" for i, nm in enumerate(names))
        self.nodes = [
            BrokerProcess(self.base / f"n{i}", port=AMQP_PORT, name=names[i],
                          host=self.net.client_ip(i), management_port=MGMT_PORT,
                          wrap=["ip", "netns", "exec", self.net.ns[i]],
                          config=(f"cluster.port = {CLUSTER_PORT}\n"
                                  f"cluster.bind = {self.net.cluster_ip(i)}\n"
                                  f"cluster.secret_file = {secret}\nloopback_users =\n"
                                  + seeds + self.extra_config))
            for i in range(self.n)
        ]
        if self.tmpfs_node is not None:
            d = self.nodes[self.tmpfs_node].data_dir
            d.mkdir(parents=True, exist_ok=True)
            sh("mount", "-t", "tmpfs", "-o", f"size={self.tmpfs_mb}m", "qxchaos", str(d))
            self.mounted.append(d)
        start_all(self.nodes, timeout)

    def mgmt_url(self, i: int) -> str:
        return f"http://{self.net.client_ip(i)}:{MGMT_PORT}"

    # process faults
    def kill(self, i: int) -> None:
        with self._lock:
            self.nodes[i].kill()
            self.paused.discard(i)
            self.down.add(i)

    def restart(self, i: int, timeout: float = 120.0) -> None:
        with self._lock:
            if i not in self.down:
                return
        try:
            self.nodes[i].start(timeout=timeout)
        except BaseException:
            self.nodes[i].kill()  # never leave a half-started process behind
            raise
        with self._lock:
            self.down.discard(i)

    def pause(self, i: int) -> None:
        with self._lock:
            if i in self.down:
                return
            self.nodes[i].freeze()
            self.paused.add(i)

    def resume(self, i: int) -> None:
        with self._lock:
            if i in self.paused:
                self.nodes[i].thaw()
                self.paused.discard(i)

    def alive(self) -> list[int]:
        """Nodes whose process runs and is not paused."""
        return [i for i in range(self.n) if i not in self.down and i not in self.paused]

    def heal_all(self, timeout: float = 120.0) -> None:
        """Remove every cut, resume paused nodes, restart dead ones (all at
        once: a node alone may wait for a quorum of its peers to start)."""
        self.net.heal()
        if self.tmpfs_node is not None:
            self.free_disk()  # before any restart: recovery needs room
        for i in list(self.paused):
            self.resume(i)
        for i, nd in enumerate(self.nodes):
            if nd.proc is not None and nd.proc.poll() is not None:
                with self._lock:
                    self.down.add(i)  # exited on its own (a crash) or was stopped
        in_parallel(lambda i: self.restart(i, timeout), sorted(self.down))

    def teardown(self) -> None:
        for i in list(self.paused):
            try:
                self.resume(i)
            except Exception:  # noqa: BLE001 - best effort
                pass
        for nd in self.nodes:
            try:
                nd.kill()
            except Exception:  # noqa: BLE001 - best effort
                pass
        self.net.teardown()
        for d in self.mounted:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)
        self.mounted.clear()

    # disk full (the tmpfs node only)
    def _filler(self) -> Path:
        assert self.tmpfs_node is not None
        return self.nodes[self.tmpfs_node].data_dir / "chaos-filler"

    def fill_disk(self) -> int:
        """Fill the tmpfs node's file system; returns the bytes written.
        ENOSPC is the point: every write, flush and the close may raise it."""
        written = 0
        f = self._filler().open("ab", buffering=0)
        try:
            for size in [1 << 20] * (self.tmpfs_mb + 1) + [4096] * 256:  # bounded
                try:
                    written += f.write(b"\0" * size) or 0
                except OSError:
                    if size == 4096:
                        break
        finally:
            try:
                f.close()
            except OSError:
                pass
        return written

    def free_disk(self) -> None:
        self._filler().unlink(missing_ok=True)

    def wait_until(self, cond, timeout: float, what: str, step: float = 0.1) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f}s")
            time.sleep(step)
