"""Peer events: what the node does when its connection to a peer breaks, and
when a peer connects again.

Where it sits: a collaborator of the node (`Node.peer_events`); the cluster
calls `down` when a connection to a peer breaks (`Cluster.on_peer_down`, from
the transport) and `reconnected` at every new connection to a peer
(`Cluster.on_reconnect`). Deciding which peers are down for good is not
here: that is `liveness.py`, on the housekeeping passes.

- **Down.** A killed node's sockets close at once, so a broken connection is
  the earliest sign that the groups it led need a new leader. Every
  follower of such a group gives up the leader's lease
  (`RaftNode.leader_unreachable`), so a pre-vote can win at once; one of
  them, the same on every node (a hash of the group over its remaining
  voters, so the new leaders spread over the nodes), campaigns after a short
  random delay (50-300 ms) if the leader is still that peer and still not
  connected. Pre-vote keeps this harmless when the leader is in fact alive.
  When every follower of thousands of groups campaigned together, most
  groups split their votes and waited a timeout to try again. Quiet groups
  it led wake (`Quiescence.leader_lost`).
- **Reconnected.** Deliveries this node's leaders sent to consumers on that
  peer may have been lost with the old connection: they are sent again (the
  channels skip what they already hold). Quiet groups shared with it wake
  (`Quiescence.peer_back`), and the peer is told this node's alarms (it may
  have missed a change).

It sees the node through `PeerEventsHost`, so it is unit-tested against
fakes (tests/runtime/test_peer_events.py).
May import: the pure cores, `peer_wire`, `raft_group`, the queue types.
"""
from __future__ import annotations

import functools
import random
import zlib
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

import broker.runtime.peer_wire as pw

from .queues import QueueProcess, QuorumQueue
from .raft_group import RaftGroup

#: the delay before the chosen follower campaigns for a group whose leader's
#: connection broke, drawn uniformly from this range (seconds)
CAMPAIGN_DELAY_S = (0.05, 0.3)


class Transport(Protocol):
    def is_connected(self, peer: str) -> bool: ...


class Peers(Protocol):
    """The cluster (runtime/cluster.py `Cluster`)."""

    @property
    def transport(self) -> Transport: ...

    def send_to(self, peer: str, msg: pw.PeerMessage) -> None: ...


class Members(Protocol):
    """The node's Raft groups and queue processes (runtime/registry.py `Registry`)."""

    @property
    def groups(self) -> Mapping[str, RaftGroup]: ...

    @property
    def queues(self) -> Mapping[tuple[str, str], QueueProcess]: ...


class Quiet(Protocol):
    """Quiescence (runtime/quiesce.py `Quiescence`)."""

    def leader_lost(self, peer: str) -> None: ...

    def peer_back(self, peer: str) -> None: ...


class LocalAlarms(Protocol):
    @property
    def local(self) -> Collection[str]: ...  # resources in alarm on this node


class PeerEventsHost(Protocol):
    @property
    def node_name(self) -> str: ...

    @property
    def cluster(self) -> Peers | None: ...

    @property
    def registry(self) -> Members: ...

    @property
    def quiescence(self) -> Quiet: ...

    @property
    def alarms(self) -> LocalAlarms: ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> object: ...


class PeerEvents:
    def __init__(self, host: PeerEventsHost,
                 uniform: Callable[[float, float], float] = random.uniform) -> None:
        """`uniform(a, b)`: the campaign delay's randomness (injected for tests)."""
        self.host = host
        self._uniform = uniform

    def down(self, peer: str) -> None:
        """The connection to `peer` broke (see the module docstring)."""
        host = self.host
        host.quiescence.leader_lost(peer)
        me = host.node_name
        for g in list(host.registry.groups.values()):
            if g.leader == peer and not g.is_leader and g.node.promotable:
                # Every follower sees the same broken connection: all of them
                # give up the lease, so a pre-vote can win at once (the
                # others campaign at their next timeout if it does not).
                g.node.leader_unreachable()
                voters = sorted(str(v) for v in g.node.config.voters if str(v) != peer)
                if voters and voters[zlib.crc32(g.group_id.encode()) % len(voters)] == me:
                    host.call_later(self._uniform(*CAMPAIGN_DELAY_S),
                                    functools.partial(self._campaign_if_leader_is, g, peer))

    def reconnected(self, peer: str) -> None:
        """A new connection from `peer`: deliveries this node's leaders sent to
        consumers there may have been lost with the old one; send them again
        (the channels skip what they already hold). Quiet groups shared with
        it wake up (runtime/quiesce.py)."""
        host = self.host
        host.quiescence.peer_back(peer)
        for q in list(host.registry.queues.values()):
            if isinstance(q, QuorumQueue) and q.is_leader and not q.deleted:
                q.redeliver_checked_out(peer)
        if host.cluster is not None:  # the peer may have missed our alarm changes
            host.cluster.send_to(peer, pw.AlarmState(sorted(host.alarms.local)))

    def _campaign_if_leader_is(self, g: RaftGroup, peer: str) -> None:
        cluster = self.host.cluster
        if g.stopped is None and g.leader == peer and not g.is_leader and \
                cluster is not None and not cluster.transport.is_connected(peer):
            g.campaign()


__all__ = ["CAMPAIGN_DELAY_S", "PeerEvents", "PeerEventsHost"]
