"""Liveness: which peers are down, which left the cluster for good, and which
AMQP channels are gone.

Where it sits: the node runs `observe()` on every housekeeping pass (every
2 s); queue leaders ask `channel_gone` / `channel_dead` when they reap the
consumers and publishers of channels that will never come back
(runtime/queues.py `reap_dead_channels`). It sees the cluster only through
the small `Peers` protocol and two callables, so it is unit-tested against
fakes (tests/runtime/test_liveness.py).

- A peer not connected for longer than the grace period (10 s) is *down*:
  its channels are dead for reaping purposes (suspected: their node may come
  back; RabbitMQ reinstates such consumers, we do not).
- A peer is *departed* once it is neither in the metadata group, nor a queue
  member, nor a recorded node, two passes in a row (`forget_node` removed
  it): it is dropped from the peer list (no restart needed) and its channels
  are gone for good. A node that joins again is a peer again.
- A channel `node|incarnation/conn/ch` is *gone* when its node restarted
  since (another incarnation said hello), when its node departed, or, for
  this node's own channels, when no open channel has that reference.

May import: nothing of the runtime (it is handed what it needs).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

log = logging.getLogger("broker.liveness")

#: A peer disconnected for longer than this is treated as down: the messages
#: its consumers had checked out go back to their queues.
PEER_DOWN_GRACE_S = 10.0


class Peers(Protocol):
    """What liveness needs of the cluster (runtime/cluster.py `Cluster`)."""

    @property
    def peers(self) -> Mapping[str, object]: ...

    @property
    def incarnations(self) -> Mapping[str, str]: ...

    def transport_up(self, peer: str) -> bool: ...

    def remove_peer(self, name: str) -> None: ...


class Liveness:
    def __init__(self, node_name: str, cluster: Peers | None,
                 known_nodes: Callable[[], Collection[str] | None],
                 local_channel_open: Callable[[str], bool],
                 clock: Callable[[], float] = time.monotonic,
                 grace_s: float = PEER_DOWN_GRACE_S) -> None:
        """`known_nodes()`: every node the metadata and the local queue groups
        name (members, recorded addresses), or None while this node is not a
        metadata member itself (its view is then no authority).
        `local_channel_open(ref)`: an open channel of this node has that ref."""
        self.node_name = node_name
        self.cluster = cluster
        self._known_nodes = known_nodes
        self._local_channel_open = local_channel_open
        self._clock = clock
        self.grace_s = grace_s
        self.down_since: dict[str, float] = {}
        self._departing: set[str] = set()  # found gone by the last pass
        self.departed: set[str] = set()  # forgotten: left the cluster for good

    # ---------------------------------------------------------------- passes
    def observe(self) -> list[str]:
        """One housekeeping pass; returns the peers forgotten by it."""
        if self.cluster is None:
            return []
        now = self._clock()
        for peer in list(self.cluster.peers):
            if self.cluster.transport_up(peer):
                self.down_since.pop(peer, None)
            else:
                self.down_since.setdefault(peer, now)
        return self._forget_departed()

    def _forget_departed(self) -> list[str]:
        assert self.cluster is not None
        known = self._known_nodes()
        if known is None:
            return []
        gone = {p for p in self.cluster.peers if p not in known}
        forgotten = sorted(gone & self._departing)
        for peer in forgotten:
            log.info("node %s left the cluster: forgetting it", peer)
            self.cluster.remove_peer(peer)
            self.down_since.pop(peer, None)
            # its channels are gone for good: their consumers go and their
            # checked-out messages return (channel_gone)
            self.departed.add(peer)
        self._departing = gone
        return forgotten

    # ---------------------------------------------------------------- questions
    def peer_gone(self, peer: str) -> bool:
        """Unreachable for longer than the grace period, or no longer a peer."""
        if self.cluster is None or peer not in self.cluster.peers:
            return True
        since = self.down_since.get(peer)
        return since is not None and self._clock() - since > self.grace_s

    def is_local(self, channel: str) -> bool:
        """Was the AMQP channel `node|incarnation/conn/ch` opened on this node
        (in this life or an earlier one)?"""
        return channel.split("/", 1)[0].split("|", 1)[0] == self.node_name

    def channel_gone(self, channel: str) -> bool:
        """Is the AMQP channel `node|incarnation/conn/ch` gone for good?"""
        prefix = channel.split("/", 1)[0]
        node = prefix.split("|", 1)[0]
        if node == self.node_name:
            # Here: gone unless an open channel has that ref (a consume applied
            # after its channel closed leaves a consumer nobody else removes).
            return not self._local_channel_open(channel)
        if self.cluster is None:
            return True
        if node in self.departed and node not in self.cluster.peers:
            return True  # it left the cluster for good (forget_node)
        live = self.cluster.incarnations.get(node)
        return live is not None and live != prefix

    def channel_dead(self, channel: str) -> bool:
        """Gone for good, or its node down for longer than the grace period
        (then only suspected: see QuorumQueue.reap_dead_channels)."""
        if self.channel_gone(channel):
            return True
        node = channel.split("|", 1)[0]
        if node == self.node_name or self.cluster is None:
            return False
        since = self.down_since.get(node)
        return since is not None and self._clock() - since > self.grace_s


__all__ = ["PEER_DOWN_GRACE_S", "Liveness", "Peers"]
