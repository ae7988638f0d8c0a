"""Static proof that the node satisfies the host Protocols of its collaborators.

Where it sits: nowhere at run time (everything here is under
`TYPE_CHECKING`; importing the module does nothing). The collaborators see
the node only through `Protocol`s they declare (the AMQP connection's
`ServerNode`, its channels' `ChannelNode`, `MembershipHost`, `RegistryHost`,
...), and node.py passes `self` to each of them. The functions below make
every such assignment in one place, including those node.py makes through
a constructor that takes its host loosely or later (a collaborator built
before the node is complete), so a `Node` that stops matching any of its
protocols fails `make lint` here, naming the protocol and the member the
node lacks or types differently.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .amqp_server import ServerNode
    from .channel import ChannelNode
    from .cluster import ClusterHost
    from .commands import CommandsHost
    from .dead_letter import DlxHost
    from .declarations import DeclarationsHost
    from .definitions import DefinitionsHost
    from .forwarding import ForwardingHost
    from .joining import JoiningHost
    from .limits import LimitsHost
    from .membership import MembershipHost
    from .msg_stats import StatsHost
    from .node import Node
    from .node_calls import NodeCallsHost
    from .peer_events import PeerEventsHost
    from .queues import Host as QueueHost
    from .registry import RegistryHost

    def _amqp_server(node: Node) -> ServerNode:
        return node

    def _channel(node: Node) -> ChannelNode:
        return node

    def _membership(node: Node) -> MembershipHost:
        return node

    def _queues(node: Node) -> QueueHost:
        return node

    def _dead_letter(node: Node) -> DlxHost:
        return node

    def _registry(node: Node) -> RegistryHost:
        return node

    def _forwarding(node: Node) -> ForwardingHost:
        return node

    def _commands(node: Node) -> CommandsHost:
        return node

    def _declarations(node: Node) -> DeclarationsHost:
        return node

    def _definitions(node: Node) -> DefinitionsHost:
        return node

    def _limits(node: Node) -> LimitsHost:
        return node

    def _cluster(node: Node) -> ClusterHost:
        return node

    def _stats(node: Node) -> StatsHost:
        return node

    def _peer_events(node: Node) -> PeerEventsHost:
        return node

    def _joining(node: Node) -> JoiningHost:
        return node

    def _node_calls(node: Node) -> NodeCallsHost:
        return node
