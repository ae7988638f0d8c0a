"""Enforcing the connection and channel limits of vhosts and users across the cluster.

Where it sits: the limits themselves are metadata (`broker.metadata.limits`,
replicated by the metadata Raft group; `max-queues` is enforced by the
metadata machine). Connections and channels live on the nodes, so the
AMQP server asks this collaborator of the node, at connection.open and at
channel.open, whether the next one is allowed; it answers with the pure
checks `md.connection_refused` / `md.channel_refused` over cluster-wide
counts.

Counts: this node's connections are counted exactly, at the moment of the
check (the event loop serialises the opens of one node). Other nodes'
counts come from a cache refreshed every `REFRESH_S` (1 s) by asking every
connected peer (the peer call "limit_counts", runtime/node_calls.py), and only
while some connection or channel limit is set, so clusters without limits
pay nothing. RabbitMQ 3.10 also counts cluster-wide from per-node tracking
tables that are updated asynchronously; here a connection opened on another
node is seen after at most about a second, so two clients opening at the
same moment on two nodes may both get in (the same race RabbitMQ has, with a
wider window). A peer that does not answer is left out of the count, as
RabbitMQ leaves out nodes that are down.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Collection, Sized
from typing import TYPE_CHECKING, Any, Protocol

import broker.metadata as md
from broker.metadata.errors import NOT_ALLOWED

if TYPE_CHECKING:
    from broker.common.config import Config

    from .cluster import Cluster

log = logging.getLogger("broker.limits")

REFRESH_S = 1.0
CALL_TIMEOUT_S = 2.0


class Counts:
    """Open connections per vhost and per user, open channels per user."""

    __slots__ = ("channels", "user_connections", "vhost_connections")

    def __init__(self, vhost_connections: dict[str, int] | None = None,
                 user_connections: dict[str, int] | None = None,
                 channels: dict[str, int] | None = None) -> None:
        self.vhost_connections: dict[str, int] = vhost_connections or {}
        self.user_connections: dict[str, int] = user_connections or {}
        self.channels: dict[str, int] = channels or {}

    def to_wire(self) -> list[dict[str, int]]:
        return [self.vhost_connections, self.user_connections, self.channels]

    @classmethod
    def from_wire(cls, raw: object) -> Counts:
        """A peer's answer; anything malformed counts as nothing."""
        if not isinstance(raw, list) or len(raw) != 3 or not all(isinstance(d, dict) for d in raw):
            return cls()

        def clean(d: dict[Any, Any]) -> dict[str, int]:  # msgpack-decoded
            return {str(k): int(v) for k, v in d.items() if isinstance(v, int) and not isinstance(v, bool)}

        return cls(clean(raw[0]), clean(raw[1]), clean(raw[2]))


class _Connection(Protocol):
    @property
    def vhost(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def channels(self) -> Sized: ...


class _Metadata(Protocol):
    @property
    def state(self) -> md.MetadataState: ...


class LimitsHost(Protocol):
    """What the limits read of the node."""

    @property
    def meta(self) -> _Metadata: ...
    @property
    def cluster(self) -> Cluster | None: ...
    @property
    def connections(self) -> Collection[_Connection]: ...
    @property
    def config(self) -> Config: ...


class ConnectionLimits:
    def __init__(self, node: LimitsHost) -> None:
        self.node = node
        #: each connected peer's last answer (see the module docstring)
        self.remote: dict[str, Counts] = {}
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._refresh_loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep counting; the next round may work
                log.exception("refreshing the cluster's connection counts failed")

    async def refresh(self) -> None:
        """Ask every connected peer for its counts (only while a limit is set)."""
        node = self.node
        cluster = node.cluster
        if cluster is None or not md.connection_limits_in_force(node.meta.state):
            self.remote.clear()
            return
        peers = [p for p in sorted(cluster.peers) if cluster.transport.is_connected(p)]
        answers = await asyncio.gather(
            *(cluster.call(p, "limit_counts", None, CALL_TIMEOUT_S) for p in peers),
            return_exceptions=True)
        fresh: dict[str, Counts] = {}
        for peer, answer in zip(peers, answers, strict=True):
            if not isinstance(answer, BaseException):
                fresh[peer] = Counts.from_wire(answer)
        self.remote = fresh

    # ------------------------------------------------------------ counts
    def local_counts(self) -> Counts:
        """This node's open connections (past connection.open) and their channels."""
        vhosts: Counter[str] = Counter()
        users: Counter[str] = Counter()
        channels: Counter[str] = Counter()
        for conn in list(self.node.connections):
            if conn.vhost and not conn.closed:
                vhosts[conn.vhost] += 1
                users[conn.user] += 1
                channels[conn.user] += len(conn.channels)
        return Counts(dict(vhosts), dict(users), dict(channels))

    def _total(self, local: Counts, table: str, key: str) -> int:
        n = getattr(local, table).get(key, 0)
        for counts in self.remote.values():
            n += getattr(counts, table).get(key, 0)
        return int(n)

    # ------------------------------------------------------------ checks
    def connection_refused(self, user: str, vhost: str) -> md.MetadataError | None:
        """connection.open of `user` on `vhost`: a 530 refusal when the vhost's
        or the user's max-connections is reached cluster-wide."""
        state = self.node.meta.state
        if not state.vhost_limits and not state.user_limits:
            return None
        if md.vhost_limit(state, vhost, md.MAX_CONNECTIONS) is None \
                and md.user_limit(state, user, md.MAX_CONNECTIONS) is None:
            return None
        local = self.local_counts()
        return md.connection_refused(state, vhost, user,
                                     self._total(local, "vhost_connections", vhost),
                                     self._total(local, "user_connections", user))

    def node_refused(self) -> md.MetadataError | None:
        """connection.open on this node: RabbitMQ 4.x's 530 refusal when
        `connection_max` connections are already open here (logged: it is the
        node's limit, not an application's)."""
        limit = self.node.config["connection_max"]
        if limit is None:
            return None
        open_here = sum(1 for c in list(self.node.connections) if c.vhost and not c.closed)
        if open_here < limit:
            return None
        text = f"connection refused: node connection limit ({limit}) is reached"
        log.warning("refused a connection: %s", text)
        return md.MetadataError(NOT_ALLOWED, text)

    def channel_refused(self, user: str) -> md.MetadataError | None:
        """channel.open by `user`: a 530 refusal when the user's max-channels
        is reached cluster-wide."""
        state = self.node.meta.state
        if not state.user_limits or md.user_limit(state, user, md.MAX_CHANNELS) is None:
            return None
        return md.channel_refused(state, user, self._total(self.local_counts(), "channels", user))
