"""Resource alarms: free disk space and memory, as RabbitMQ raises them.

Where it sits: the node checks its own resources every
`alarms.check_interval_ms` (`Alarms.check`), tells every peer when its set of
alarms changes and after every reconnect (peer message `Alarms`), and keeps
the peers' sets (`set_remote`; a peer that goes down takes its alarms with
it). While any node of the cluster has an alarm in effect, AMQP connections
that publish are blocked: `connection.blocked` to clients that asked for it,
and the server stops reading from the connection (runtime/amqp_server.py);
connections that only consume and acknowledge are untouched, so queues keep
draining. When the last alarm clears, blocked connections get
`connection.unblocked` and are read again. Nothing already accepted is
refused or dropped: a blocked publisher's in-flight publishes are confirmed
as usual.

- disk: free space of the data directory's file system below
  `disk_free_limit.absolute` (default 50 MB, RabbitMQ's), or, if
  `disk_free_limit.relative` is set, that multiple of the memory total;
- memory: the process's resident memory above
  `vm_memory_high_watermark.relative` (default 0.6, RabbitMQ 4.x) of the
  memory total (the cgroup limit when there is one, else RAM), or above
  `vm_memory_high_watermark.absolute` when set.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from broker.common.config import Config

log = logging.getLogger("broker.alarms")

DISK = "disk"
MEMORY = "memory"


def memory_total() -> int:
    """Bytes of memory this process may use: the cgroup v2 limit if one is
    set, else the machine's RAM."""
    try:
        raw = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if raw.isdigit():
            return int(raw)
    except OSError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def resident_memory() -> int:
    """This process's resident set size, bytes."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def blocked_reason(resources: set[str] | frozenset[str]) -> str:
    """The connection.blocked reason text for the alarms in effect."""
    parts = [r for r in (MEMORY, DISK) if r in resources]
    return "low on " + " & ".join(parts) if parts else ""


class Alarms:
    """This node's resource checks and the cluster's alarm picture."""

    def __init__(self, node_name: str, data_dir: str | Path, config: Config) -> None:
        self.node_name = node_name
        self.data_dir = str(data_dir)
        total = memory_total()
        self.mem_total = total
        absolute_mem = int(config["vm_memory_high_watermark.absolute"])
        relative_mem = float(config["vm_memory_high_watermark.relative"])
        self.mem_limit = absolute_mem if absolute_mem > 0 else int(total * relative_mem)
        relative_disk = float(config["disk_free_limit.relative"])
        self.disk_limit = (int(total * relative_disk) if relative_disk > 0
                           else int(config["disk_free_limit.absolute"]))
        self.disk_free: int | None = None
        self.mem_used = 0
        self.local: frozenset[str] = frozenset()
        self.remote: dict[str, frozenset[str]] = {}

    # ---------------------------------------------------------------- checks
    def check(self) -> bool:
        """Measure now; True if this node's alarms changed."""
        try:
            self.disk_free = shutil.disk_usage(self.data_dir).free
        except OSError as exc:
            log.warning("cannot read free disk space of %s: %s", self.data_dir, exc)
        self.mem_used = resident_memory()
        now: set[str] = set()
        if self.disk_limit > 0 and self.disk_free is not None and self.disk_free < self.disk_limit:
            now.add(DISK)
        if self.mem_limit > 0 and self.mem_used > self.mem_limit:
            now.add(MEMORY)
        if now == self.local:
            return False
        for r in sorted(now - self.local):
            log.warning("%s resource limit alarm set on node %s (%s); publishers will be blocked",
                        r, self.node_name, self._numbers(r))
        for r in sorted(self.local - now):
            log.warning("%s resource limit alarm cleared on node %s (%s)", r, self.node_name,
                        self._numbers(r))
        self.local = frozenset(now)
        return True

    def _numbers(self, resource: str) -> str:
        if resource == DISK:
            return f"free {self.disk_free} bytes, limit {self.disk_limit}"
        return f"resident {self.mem_used} bytes, limit {self.mem_limit}"

    # ---------------------------------------------------------------- the cluster
    def set_remote(self, peer: str, resources: list[str] | tuple[str, ...]) -> bool:
        """A peer's alarms; True if that changed anything."""
        new = frozenset(r for r in resources if r in (DISK, MEMORY))
        if self.remote.get(peer, frozenset()) == new:
            return False
        if new:
            self.remote[peer] = new
            log.warning("resource alarm(s) %s in effect on node %s", ", ".join(sorted(new)), peer)
        else:
            self.remote.pop(peer, None)
            log.info("resource alarms cleared on node %s", peer)
        return True

    def drop_remote(self, peer: str) -> bool:
        """A peer is down: its alarms no longer count (RabbitMQ clears them too)."""
        return self.remote.pop(peer, None) is not None

    def in_effect(self) -> frozenset[str]:
        """Resources with an alarm anywhere in the cluster."""
        out = set(self.local)
        for rs in self.remote.values():
            out |= rs
        return frozenset(out)

    def cluster_alarms(self) -> list[dict[str, str]]:
        """[{node, resource}] for every alarm in effect, RabbitMQ's shape."""
        out = [{"node": self.node_name, "resource": r} for r in sorted(self.local)]
        for peer, rs in sorted(self.remote.items()):
            out += [{"node": peer, "resource": r} for r in sorted(rs)]
        return out


__all__ = ["DISK", "MEMORY", "Alarms", "blocked_reason", "memory_total", "resident_memory"]
