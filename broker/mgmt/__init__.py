"""Management HTTP API (aiohttp), Prometheus metrics and health checks.

Where it sits: the I/O shell's HTTP side, started by `Node.start()` when
`management.tcp.port` / `prometheus.tcp.port` are non-zero. It reads the
node's live state and writes through the node's own operations, all through
one typed port (`port.ManagementPort`, implemented by
`broker.runtime.mgmt_port.NodePort`); it never imports `broker.runtime`.
`broker.cli` (qqctl) is its client.
"""
from .api import make_app
from .api_common import ApiError
from .metrics import GroupSampler, NodeCollector, make_registry, metrics_app
from .openapi import openapi_document
from .reconcile import AddMember, QueueMembers, Reconciler, RemoveMember, plan
from .server import ManagementServers, start_servers

__all__ = [
    "AddMember", "ApiError", "GroupSampler", "QueueMembers", "Reconciler", "RemoveMember",
    "plan", "ManagementServers", "NodeCollector", "make_app",
    "make_registry", "metrics_app", "openapi_document", "start_servers",
]
