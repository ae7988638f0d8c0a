"""One broker node: storage, the metadata group, queue members, the AMQP listener.

Where it sits: the top of the I/O shell, and its wiring. `Node.start()`
opens the node's storage (one WAL shared by every Raft group here), recovers
the metadata group and every local queue member it lists, starts the Raft
tick timer and the AMQP listener. The process around it (`main`, signals,
the management servers over the node) is runtime/app.py.

What it owns: start/stop, TLS, the tick timer, routing of storage callbacks,
housekeeping and alarm wiring. Its jobs live in collaborators, each behind a
small host Protocol the node satisfies: `registry` (queue processes,
metadata effects: registry.py), `forwarding` (where commands go, the drain
of forwarded publishes: forwarding.py), `commands` (queue commands, dead
lettering: commands.py), `joining` (entering a cluster, admitting joiners:
joining.py), `peer_events` (a peer's connection broke or is new:
peer_events.py), `calls` (the node-local views peers ask for, asking every
node: node_calls.py), `declarations`, `liveness`, `quiescence`,
`membership`, `limits`, `alarms`. Its remaining queue-facing methods are
one-line delegates that those protocols (the queues' `Host`, `ClusterHost`,
...) name.

Channel references are `"<node>|<incarnation>/<connection>/<channel>"`: the
incarnation changes at every start, so after a restart a queue leader can tell
which consumers belong to a previous life of a node and return their
messages (see QuorumQueue._leader_housekeeping).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

import broker.metadata as md
import broker.queue as qm
import broker.runtime.peer_wire as pw
import broker.storage as st
import broker.storage.manifest as st_manifest
from broker.amqp.connection import ServerConfig
from broker.common.config import Config, ConfigError
from broker.common.tls import server_context
from broker.raft import RaftConfig

from .alarms import DISK, Alarms
from .amqp_server import AmqpConnection
from .cluster import Cluster
from .commands import Commands
from .declarations import Declarations
from .definitions import load_definitions_file
from .forwarding import Forwarding
from .joining import Joining
from .limits import ConnectionLimits
from .liveness import Liveness
from .membership import Membership
from .metastore import CLUSTER_NODES, META_GROUP, MetadataStore
from .msg_stats import NodeStats
from .node_calls import NodeCalls
from .peer_events import PeerEvents
from .queues import Message, QueueProcess, QueueUid, QuorumQueue
from .quiesce import PASS_TICKS, Quiescence
from .registry import Registry

log = logging.getLogger("broker.node")
#: how often the node's storage figures (/api/nodes) are measured again
STORAGE_USAGE_INTERVAL_S = 5.0


class Node:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.node_name: str = config["node.name"]
        self.incarnation = f"{self.node_name}|{os.urandom(4).hex()}"
        self.data_dir = Path(config["node.data_dir"])
        self.amqp_config = ServerConfig(
            frame_max=config["frame_max"], channel_max=config["channel_max"],
            heartbeat=config["heartbeat"], cluster_name=self.node_name,
            max_message_size=config["max_message_size"],
        )
        tick_ms = config["raft.tick_ms"]
        self.tick_s = tick_ms / 1000
        election_ticks = max(2, config["raft.election_timeout_ms"] // tick_ms)
        self.raft_config = RaftConfig(election_tick=election_ticks, heartbeat_tick=1)
        #: the queue processes, Raft groups and classic logs of this node (runtime/registry.py)
        self.registry = Registry(self, config["raft.snapshot_interval"],
                                 config["raft.snapshot_interval_bytes"])
        #: where queue commands go; the node's side of the ordered publish path (runtime/forwarding.py)
        self.forwarding = Forwarding(self)
        #: queue commands (one-shot, reliable), gets' bodies, at-most-once dead lettering (runtime/commands.py)
        self.commands = Commands(self)
        #: the registry's table of queue processes (the same dict), for the many readers
        self.queues = self.registry.queues
        self.connections: set[AmqpConnection] = set()
        self.storage: st.LogManager | None = None
        self.meta: MetadataStore = None  # type: ignore[assignment]
        self._server: asyncio.base_events.Server | None = None
        self._tls_server: asyncio.base_events.Server | None = None
        self.tls_port = 0  # the AMQP over TLS listener's port (0: off)
        self._tick_task: asyncio.Task[None] | None = None
        groups = self.registry.groups
        # idle groups stop ticking; peers are watched instead (runtime/quiesce.py)
        self.quiescence = Quiescence(None, groups.values, groups.get,
                                     skip=(META_GROUP,), interval_s=PASS_TICKS * self.tick_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        #: this node's storage figures (storage.manifest.node_usage), refreshed
        #: every STORAGE_USAGE_INTERVAL_S by the alarm loop
        self.storage_usage: dict[str, int] = {}
        self._borrowed_refs: set[str] = set()  # see borrow_channel
        self.port = 0
        self.cluster: Cluster | None = None
        #: a node with an empty data directory entering the cluster, and
        #: admitting such nodes as metadata leader (runtime/joining.py)
        self.joining = Joining(self, config["cluster.port"])
        self._join_task: asyncio.Task[None] | None = None
        #: what a broken or new connection to a peer sets off (runtime/peer_events.py)
        self.peer_events = PeerEvents(self)
        #: the node-local views peers ask for, and asking every node (runtime/node_calls.py)
        self.calls = NodeCalls(self)
        #: this node's message counters (runtime/msg_stats.py), made by its first AMQP connection
        self.msg_stats: NodeStats | None = None
        self.membership = Membership(self)
        self.liveness = Liveness(self.node_name, None, self._known_nodes, self._local_channel_open)
        self.declarations = Declarations(self)
        #: vhost/user connection and channel limits, counted cluster-wide (runtime/limits.py)
        self.limits = ConnectionLimits(self)
        self._housekeeping_task: asyncio.Task[None] | None = None
        self.alarms = Alarms(self.node_name, self.data_dir, config)
        #: resources with an alarm anywhere in the cluster: publishers are blocked
        self.alarm_resources: frozenset[str] = frozenset()
        self._alarm_task: asyncio.Task[None] | None = None
        self._stopping = False

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        cfg = self.config
        # listener settings are checked before anything touches the disk
        if cfg["listeners.tcp"] == "none" and not cfg["listeners.ssl.default"]:
            raise ConfigError("listeners.tcp = none needs listeners.ssl.default: no AMQP listener left")
        amqp_tls = server_context(cfg.values, "ssl_options") if cfg["listeners.ssl.default"] else None
        for prefix in ("management.ssl", "prometheus.ssl"):
            if cfg[f"{prefix}.port"]:
                # refuse bad files now, not after the cluster formed (the
                # management servers are started over the node by app.py)
                server_context(cfg.values, prefix)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.storage = st.LogManager.open(
            self.data_dir / "raft",
            st.StorageConfig(wal_max_size_bytes=self.config["raft.wal_max_size_bytes"],
                             segment_max_entries=self.config["raft.segment_max_entries"]),
            on_durable=DurableHandoff(loop, self._durable).notify,
            on_error=lambda g, e: _call_soon(loop, self._storage_error, g, e),
        )
        members = [self.node_name]
        seeds = self.config["cluster.seeds"]
        joining = False
        meta_glog = self.storage.open_group(META_GROUP)
        if seeds:
            server_ssl, client_ssl = self._cluster_tls()
            self.cluster = Cluster(self, seeds, self.config["cluster.bind"],
                                   self.config["cluster.port"], self._cluster_secret(),
                                   server_ssl=server_ssl, client_ssl=client_ssl)
            self.liveness.cluster = self.cluster
            self.quiescence.cluster = self.cluster
            members = self.cluster.members
            initial = list(self.config["cluster.initial_members"]) or members
            fresh = meta_glog.last_index() == 0 and meta_glog.snapshot_meta() is None
            if self.node_name not in initial:
                # Not one of the nodes that formed the cluster: join it. (With
                # data, this node is already a member and simply restarts.)
                joining = fresh
            else:
                members = sorted(initial)
            self.cluster.on_peer_down = self.peer_events.down
            self.cluster.on_reconnect = self.peer_events.reconnected
            await self.cluster.start()
        self.meta = MetadataStore(
            self.node_name, meta_glog,
            [] if joining else members, self.send_raft,
            self.raft_config, self.registry.meta_effects, self.forwarding.forward_meta,
            learner=joining, on_cluster_node=self.joining.learned_node,
            default_user=self.config["default_user"],
            default_pass=self.config["default_pass"], default_vhost=self.config["default_vhost"],
        )
        self.registry.groups[META_GROUP] = self.meta.group
        # A fresh replica (empty log, no snapshot): the cluster is being created.
        fresh = self.meta.glog.last_index() == 0 and self.meta.glog.latest_snapshot() is None
        if len(members) == 1:
            self.meta.group.campaign()
        self._tick_task = loop.create_task(self._ticker())
        if joining:
            self._join_task = loop.create_task(self.joining.join())
        await self._wait(lambda: self.meta.bootstrapped and self.meta.group.leader is not None,
                         self.config["cluster.formation_timeout_ms"] / 1000,
                         "the metadata store did not become ready (is a quorum of "
                         f"{members} reachable?)")
        self._housekeeping_task = loop.create_task(self._housekeeping())
        self.limits.start()
        self.alarms.check()
        self._alarms_changed()
        if self.storage is not None:
            self.storage_usage = st_manifest.node_usage(self.storage.data_dir)
        self._alarm_task = loop.create_task(self._alarm_loop())
        # Re-open local members of queues the metadata lists (a restart).
        for record in list(self.meta.state.queues.values()):
            self.registry.start_queue(record)
        # Channels of this node's previous life still holding messages (or a
        # publisher entry) in its queues closed while it was down: close them
        # as a channel closing now is closed (reliably, counted by
        # commands_settled), so the first declare-ok after a restart counts
        # the messages they held, as RabbitMQ's does.
        for q in list(self.queues.values()):
            if isinstance(q, QuorumQueue):
                for ch in q.gone_channels():
                    if self.liveness.is_local(ch):
                        self.commands.queue_command_reliable(q.uid, qm.ChannelDown(ch))
        self.registry.drop_orphan_classic_logs()
        await self.registry.delete_stale_temporaries()
        if fresh and self.config["load_definitions"] and self.meta.group.is_leader:
            # Once, by the node that created the cluster, before clients can connect.
            await load_definitions_file(self, self.config["load_definitions"])
        if cfg["listeners.tcp"] != "none":
            self._server = await loop.create_server(
                lambda: AmqpConnection(self), cfg["listeners.tcp.bind"],
                cfg["listeners.tcp.default"], reuse_address=True)
            self.port = self._server.sockets[0].getsockname()[1]
            log.info("node %s: AMQP listening on %s:%d", self.node_name,
                     cfg["listeners.tcp.bind"], self.port)
        if cfg["listeners.ssl.default"]:
            self._tls_server = await loop.create_server(
                lambda: AmqpConnection(self), cfg["listeners.ssl.bind"], cfg["listeners.ssl.default"],
                reuse_address=True, ssl=amqp_tls)
            self.tls_port = self._tls_server.sockets[0].getsockname()[1]
            log.info("node %s: AMQP over TLS listening on %s:%d", self.node_name,
                     cfg["listeners.ssl.bind"], self.tls_port)
            if self._server is None:
                self.port = self.tls_port

    async def stop(self) -> None:
        # From here on, callbacks from storage threads and late Readies must
        # not touch closed storage or transport (nor report groups stopped).
        self._stopping = True
        for g in list(self.registry.groups.values()):
            g.shutting_down = True
        if self._server is not None:
            self._server.close()
        if self._tls_server is not None:
            self._tls_server.close()
        for conn in list(self.connections):
            conn.force_close("broker forced connection closure with reason 'shutdown'")
            if conn.transport is not None:
                conn.transport.close()
        if self._tick_task is not None:
            self._tick_task.cancel()
        if self._housekeeping_task is not None:
            self._housekeeping_task.cancel()
        if self._alarm_task is not None:
            self._alarm_task.cancel()
        self.limits.stop()
        if self._join_task is not None:
            self._join_task.cancel()
        for q in self.queues.values():
            q.close()
        if self.cluster is not None:
            await self.cluster.close()
        if self.storage is not None:
            self.storage.close()

    def _cluster_tls(self) -> tuple[Any, Any]:
        """Optional TLS between peers (cluster.tls.certfile/keyfile/cafile).
        With a CA file both sides verify each other's certificate (mutual
        TLS) and the peer's host name; the shared secret is checked as well."""
        cert, key, ca = (self.config["cluster.tls.certfile"], self.config["cluster.tls.keyfile"],
                         self.config["cluster.tls.cafile"])
        if not cert:
            if key or ca:
                raise ConfigError("cluster.tls.certfile: required when cluster.tls.keyfile or "
                                  "cluster.tls.cafile is set")
            return None, None
        import ssl

        try:
            server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca or None)
            server.load_cert_chain(cert, key or None)
            client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
            client.load_cert_chain(cert, key or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cluster.tls: cannot load {cert} / {key} / {ca}: {exc}") from None
        if ca:
            server.verify_mode = ssl.CERT_REQUIRED
        else:
            client.check_hostname = False
            client.verify_mode = ssl.CERT_NONE
        return server, client

    def _cluster_secret(self) -> bytes:
        path = self.config["cluster.secret_file"]
        if not path:
            raise ConfigError("cluster.secret_file: required when cluster.seeds is set "
                              "(the shared secret peers authenticate each other with)")
        try:
            secret = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"cluster.secret_file: cannot read {path}: {exc}") from None
        if len(secret) < 16:
            raise ConfigError("cluster.secret_file: the secret must be at least 16 bytes")
        return secret

    async def _wait(self, cond: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(what)
            await asyncio.sleep(0.01)

    async def _ticker(self) -> None:
        n = 0
        while True:
            await asyncio.sleep(self.tick_s)
            n += 1
            if n % PASS_TICKS == 0:  # before the ticks: their heartbeats are not sent yet
                try:
                    self.quiescence.run_pass()
                except Exception:  # noqa: BLE001 - never stop every group's ticks
                    log.exception("quiescence pass failed")
            for g in list(self.registry.groups.values()):
                if not g.quiesced:
                    g.tick()

    def quiet_notice(self, peer: str, msg: pw.Quiesce) -> None:
        self.quiescence.notice(peer, msg)

    def quiet_keepalive(self, peer: str, msg: pw.StillQuiet) -> None:
        self.quiescence.still_quiet_from(peer, msg)

    def _durable(self, group_id: str) -> None:
        g = self.registry.storage_group(group_id)
        if g is not None and not self._stopping:
            g.on_durable()

    def _storage_error(self, group_id: str, exc: BaseException) -> None:
        g = self.registry.storage_group(group_id)
        if g is not None and not self._stopping:
            g.on_storage_error(exc)

    def log_status(self) -> None:
        """SIGUSR1: write every Raft group's status and queue counts to the log."""
        for gid, g in sorted(self.registry.groups.items()):
            st_ = g.node.status()
            log.warning("status %s: role=%s term=%s leader=%s commit=%s applied=%s last=%s "
                        "first=%s config=%s progress=%s", gid, st_.role.name, st_.term, st_.leader,
                        st_.commit, st_.applied, st_.last_index, st_.first_index,
                        sorted(st_.config.voters), {k: (p.match, p.next, p.state)
                                                    for k, p in st_.progress.items()})
        for (vhost, name), q in sorted(self.queues.items()):
            log.warning("queue %s/%s (%s): %s", vhost, name, type(q).__name__, q.overview())
        for gid, reason in sorted(self.stopped_members().items()):
            log.warning("STOPPED group %s: %s", gid, reason)
        if self.cluster is not None:
            log.warning("peers connected: %s; incarnations: %s",
                        {p: self.cluster.transport.is_connected(p) for p in self.cluster.peers},
                        self.cluster.incarnations)

    def stopped_members(self) -> dict[str, str]:
        """Raft groups on this node that stopped (a broken invariant, a storage
        failure) or could not start: group or queue -> reason. Reported by
        the health check `raft-groups`, the metric qq_raft_groups_stopped and
        SIGUSR1's status dump."""
        out = {gid: f"{type(g.stopped).__name__}: {g.stopped}"
               for gid, g in self.registry.groups.items() if g.stopped is not None}
        for (vhost, name), reason in self.registry.failed_members.items():
            out[f"{vhost}/{name}"] = reason
        return out

    def send_raft(self, dst: str, msg: Any) -> None:
        if self.cluster is not None:
            self.cluster.send_raft(dst, msg)

    def step_group(self, group_id: str, msg: Any) -> None:
        g = self.registry.groups.get(group_id)
        if g is not None:
            g.step(msg)

    async def _housekeeping(self) -> None:
        """Every `cluster.housekeeping_interval_ms` (2 s): note peers that are
        down, let the queues this node leads return the messages of
        consumers on dead channels, and, while the disk is not in alarm,
        restart the metadata group and the queue members a failed write
        stopped (`MetadataStore.restart_stopped`, `Registry.restart_stopped`)."""
        interval = self.config["cluster.housekeeping_interval_ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            if self.cluster is not None:
                self.liveness.observe()
                if self.alarms.local:
                    self._broadcast_alarms()  # repeated while in effect: a lost one is mended
                gone = [p for p in self.alarms.remote if self.liveness.peer_gone(p)]
                if gone:
                    for p in gone:
                        self.alarms.drop_remote(p)
                    self._alarms_changed()
            for q in list(self.queues.values()):
                if isinstance(q, QuorumQueue) and q.is_leader and not q.deleted:
                    q.reap_dead_channels()
            if DISK not in self.alarms.local:  # members a full disk stopped start again
                try:
                    if self.storage is not None:
                        meta_group = self.meta.restart_stopped(self.storage)
                        if meta_group is not None:
                            self.registry.groups[META_GROUP] = meta_group
                except Exception:  # noqa: BLE001 - housekeeping goes on
                    log.exception("restarting the metadata group failed")
                try:
                    self.registry.restart_stopped()
                except Exception:  # noqa: BLE001 - housekeeping goes on
                    log.exception("restarting stopped members failed")

    # ------------------------------------------------------------ resource alarms
    async def _alarm_loop(self) -> None:
        interval = self.config["alarms.check_interval_ms"] / 1000
        loop = asyncio.get_running_loop()
        usage_due = 0.0
        while True:
            await asyncio.sleep(interval)
            if self.alarms.check():
                self._broadcast_alarms()
                self._alarms_changed()
            if self.storage is not None and loop.time() >= usage_due:
                # the storage figures /api/nodes shows: a directory walk, off the loop
                usage_due = loop.time() + STORAGE_USAGE_INTERVAL_S
                self.storage_usage = await loop.run_in_executor(
                    None, st_manifest.node_usage, self.storage.data_dir)

    def _broadcast_alarms(self) -> None:
        if self.cluster is None:
            return
        state = pw.AlarmState(sorted(self.alarms.local))
        for peer in list(self.cluster.peers):
            if self.cluster.transport.is_connected(peer):
                self.cluster.send_to(peer, state)

    def remote_alarms(self, peer: str, resources: list[str]) -> None:
        """A peer's alarm state (peer message AlarmState)."""
        if self.alarms.set_remote(peer, resources):
            self._alarms_changed()

    def _alarms_changed(self) -> None:
        """Block publishing connections while an alarm is in effect anywhere
        in the cluster; unblock them all when the last one clears."""
        resources = self.alarms.in_effect()
        if resources == self.alarm_resources:
            return
        self.alarm_resources = resources
        for conn in list(self.connections):
            conn.alarms_changed(resources)

    def _known_nodes(self) -> set[str] | None:
        """Every node the metadata and this node's queue groups name (for
        Liveness: a peer outside this set left the cluster), or None while
        this node is not a metadata member itself."""
        config = self.meta.group.node.config
        if self.node_name not in config.members:
            return None
        known: set[str] = set(config.members)
        for r in self.meta.state.queues.values():
            known.update(r.members)
        for q in self.queues.values():
            group = getattr(q, "group", None)
            if group is not None:
                known.update(group.node.config.members)
        for (_vh, component, name), _p in self.meta.state.parameters.items():
            if component == CLUSTER_NODES:
                known.add(name)
        return known

    def _local_channel_open(self, ref: str) -> bool:
        return ref in self._borrowed_refs or any(
            ch.ref == ref and not ch.closed for c in self.connections for ch in c.channels.values())

    def borrow_channel(self, ref: str) -> None:
        """A channel reference used outside AMQP (the management API's get,
        which takes messages under it) is open until given back: the queue
        leaders' housekeeping must not take it for a dead channel's and
        return what it holds mid-way. Given back, it is reaped like any
        closed channel (its empty consumer entry goes)."""
        self._borrowed_refs.add(ref)

    def give_back_channel(self, ref: str) -> None:
        self._borrowed_refs.discard(ref)

    def handle_join(self, name: str, host: str, port: int) -> None:
        """A peer's `Join` (ClusterHost): runtime/joining.py."""
        self.joining.handle_join(name, host, port)

    def channel_gone(self, channel: str) -> bool:
        return self.liveness.channel_gone(channel)

    def channel_dead(self, channel: str) -> bool:
        return self.liveness.channel_dead(channel)

    # ------------------------------------------------------------ forwarding
    # (runtime/forwarding.py; the node is the queues' Host and the cluster's
    # node, which call these)
    def queue_leader(self, vhost: str, name: str) -> str | None:
        return self.forwarding.queue_leader(vhost, name)

    def recorded_leader(self, vhost: str, name: str) -> str | None:
        return self.forwarding.recorded_leader(vhost, name)

    def forward(self, leader: str, vhost: str, name: str, payload: Any) -> asyncio.Future[Any]:
        return self.forwarding.forward(leader, vhost, name, payload)

    def submit_as_leader(self, vhost: str, name: str, payload: Any) -> asyncio.Future[Any]:
        return self.forwarding.submit_as_leader(vhost, name, payload)

    def flush_forwarded(self, vhost: str, name: str) -> None:
        self.forwarding.flush_forwarded(vhost, name)

    def send_deliveries(self, node: str, vhost: str, name: str, channel: str, tag: str,
                        deliveries: list[Any], bodies: dict[int, Any]) -> None:
        self.forwarding.send_deliveries(node, vhost, name, channel, tag, deliveries, bodies)

    def remote_deliveries(self, vhost: str, name: str, channel: str, tag: str,
                          deliveries: list[Any], bodies: dict[int, Any]) -> None:
        self.forwarding.remote_deliveries(vhost, name, channel, tag, deliveries, bodies)

    def leader_elected(self, vhost: str, name: str, term: int) -> None:
        self.forwarding.leader_elected(vhost, name, term)

    @property
    def meta_group(self) -> Any:
        return self.meta.group

    @property
    def unreachable(self) -> frozenset[str]:
        return self.quiescence.unreachable

    # ------------------------------------------------------------ node calls
    def serve_call(self, op: str, args: Any) -> Any:
        """A peer's node-local question (ClusterHost): runtime/node_calls.py."""
        return self.calls.serve_call(op, args)

    # ------------------------------------------------------------ metadata
    async def meta_execute(self, cmd: Any) -> Any:
        return await self.meta.execute(cmd)

    # ------------------------------------------------------------ declarations
    # (runtime/declarations.py: callers use `node.declarations`; these are the
    # node's side of DeclarationsHost, plus the queue Host's queue_expired)
    @property
    def meta_state(self) -> md.MetadataState:
        return self.meta.state

    def cluster_nodes(self) -> list[str]:
        return list(self.cluster.members) if self.cluster is not None else [self.node_name]

    def peer_connected(self, node: str) -> bool:
        return self.cluster is not None and self.cluster.transport.is_connected(node)

    async def wait_for_leader(self, q: Any, vhost: str, name: str) -> None:
        if isinstance(q, QuorumQueue):
            await self._wait(lambda: q.leader_node is not None and (q.group.leader is not None)
                             or q.deleted, 30, f"queue '{name}' in vhost '{vhost}' has no leader")

    def queue_expired(self, vhost: str, name: str) -> None:
        self.declarations.queue_expired(vhost, name)

    def queue(self, vhost: str, name: str) -> QueueProcess | None:
        """This node's process of a queue (the registry's; for the hosts the
        node is: declarations, dead-letter workers, the cluster, channels)."""
        return self.registry.queue(vhost, name)

    # ------------------------------------------------------------ queue commands
    # (runtime/commands.py; the node is the host of declarations, dead-letter
    # workers, queues and the registry, which call these)
    def submit_enqueue(self, uid: QueueUid, payload: list[Any]) -> asyncio.Future[Any]:
        return self.commands.submit_enqueue(uid, payload)

    def queue_command_reliable(self, uid: QueueUid, cmd: qm.Command, on_applied: Any = None) -> None:
        self.commands.queue_command_reliable(uid, cmd, on_applied)

    def remember_dequeued(self, vhost: str, name: str, index: int, msg: Message) -> None:
        self.commands.remember_dequeued(vhost, name, index, msg)

    def dequeued_message(self, vhost: str, name: str, index: int) -> Message | None:
        q = self.queue(vhost, name)
        return self.commands.dequeued_message(q, index) if q is not None else None

    async def commands_settled(self, uid: QueueUid, timeout: float = 5.0) -> None:
        await self.commands.commands_settled(uid, timeout)

    def dead_letter(self, vhost: str, exchange: str, routing_key: str | None,
                    messages: list[tuple[Message, dict[str, Any]]]) -> None:
        self.commands.dead_letter(vhost, exchange, routing_key, messages)

    def call_later(self, delay: float, fn: Any) -> Any:
        assert self._loop is not None
        return self._loop.call_later(delay, fn)

class DurableHandoff:
    """The WAL writer's `on_durable` calls, carried onto the loop in one
    `call_soon_threadsafe` for as many as arrive before the loop drains them
    (one per group and WAL batch, else: ~1.3 us each against ~0.1 batched,
    bench/loop_handoff.py). Each group id is drained once a pass; its group
    reads what is durable when called, so later reports add nothing.

    Lock-free under the GIL: the writer appends then schedules a drain unless
    one is pending; the drain clears `_scheduled` before it takes the queue,
    so an id appended after the take finds the flag clear and schedules the
    next drain (at worst two drains for one id; never none)."""

    __slots__ = ("_loop", "_fn", "_queue", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Any) -> None:
        self._loop = loop
        self._fn = fn
        self._queue: deque[str] = deque()
        self._scheduled = False

    def notify(self, group_id: str, index: int, term: int) -> None:
        """On the WAL writer thread."""
        self._queue.append(group_id)
        if not self._scheduled:
            self._scheduled = True
            _call_soon(self._loop, self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        q = self._queue
        seen: set[str] = set()
        fn = self._fn
        while q:
            gid = q.popleft()
            if gid not in seen:
                seen.add(gid)
                try:
                    fn(gid)
                except Exception:  # noqa: BLE001 - one group's failure must not drop the others' reports
                    log.exception("durable report for group %s failed", gid)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    """From the storage threads onto the loop (a no-op once the loop closed)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass
