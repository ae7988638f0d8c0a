"""Start and stop the management services of one node.

Where it sits: called by `Node.start()` / `Node.stop()` (the runtime hands
in its management port, `broker.runtime.mgmt_port.NodePort`; this package
never imports the runtime). Each listener runs only when its
port is non-zero: `management.tcp.port` / `management.tcp.bind`,
`management.ssl.port` (HTTPS, `management.ssl.*`), `prometheus.tcp.port` /
`prometheus.tcp.bind` and `prometheus.ssl.port` (`prometheus.ssl.*`); the
membership reconciler
(`reconcile`) runs when
`quorum_queue.continuous_membership_reconciliation.enabled` is true.
"""
from __future__ import annotations

import logging
import ssl

from aiohttp import web

from broker.common.tls import server_context

from .api import make_app
from .metrics import GroupSampler, make_registry, metrics_app
from .port import ManagementPort
from .reconcile import Reconciler

log = logging.getLogger("broker.mgmt")


class ManagementServers:
    """The node's HTTP listeners. `management_port` / `metrics_port` are the
    bound ports (0 when that listener is off)."""

    def __init__(self, port: ManagementPort) -> None:
        self.port = port
        self.management_port = 0
        self.metrics_port = 0
        self.management_tls_port = 0
        self.metrics_tls_port = 0
        self.sampler: GroupSampler | None = None
        self.reconciler: Reconciler | None = None
        self._runners: list[web.AppRunner] = []

    async def start(self) -> ManagementServers:
        cfg = self.port.config
        if cfg["management.tcp.port"]:
            self.management_port = await self._serve(
                make_app(self.port), cfg["management.tcp.bind"], cfg["management.tcp.port"])
            log.info("node %s: management API on %s:%d", self.port.node_name,
                     cfg["management.tcp.bind"], self.management_port)
        if cfg["management.ssl.port"]:
            self.management_tls_port = await self._serve(
                make_app(self.port), cfg["management.ssl.bind"], cfg["management.ssl.port"],
                server_context(cfg.values, "management.ssl"))
            log.info("node %s: management API over HTTPS on %s:%d", self.port.node_name,
                     cfg["management.ssl.bind"], self.management_tls_port)
        if cfg["prometheus.tcp.port"] or cfg["prometheus.ssl.port"]:
            self.sampler = GroupSampler(self.port)
            self.sampler.start()
            registry = make_registry(self.port, self.sampler)
            if cfg["prometheus.tcp.port"]:
                self.metrics_port = await self._serve(
                    metrics_app(registry), cfg["prometheus.tcp.bind"],
                    cfg["prometheus.tcp.port"])
                log.info("node %s: metrics on %s:%d", self.port.node_name,
                         cfg["prometheus.tcp.bind"], self.metrics_port)
            if cfg["prometheus.ssl.port"]:
                self.metrics_tls_port = await self._serve(
                    metrics_app(registry), cfg["prometheus.ssl.bind"],
                    cfg["prometheus.ssl.port"], server_context(cfg.values, "prometheus.ssl"))
                log.info("node %s: metrics over HTTPS on %s:%d", self.port.node_name,
                         cfg["prometheus.ssl.bind"], self.metrics_tls_port)
        if cfg["quorum_queue.continuous_membership_reconciliation.enabled"]:
            self.reconciler = Reconciler.from_config(self.port).start()
        return self

    async def _serve(self, app: web.Application, bind: str, port: int,
                     ssl_context: ssl.SSLContext | None = None) -> int:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, bind, port, reuse_address=True, ssl_context=ssl_context)
        await site.start()
        self._runners.append(runner)
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def close(self) -> None:
        if self.reconciler is not None:
            await self.reconciler.close()
        if self.sampler is not None:
            await self.sampler.close()
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()


async def start_servers(port: ManagementPort) -> ManagementServers:
    return await ManagementServers(port).start()
