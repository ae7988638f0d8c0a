"""The management port: what the management API, the metrics collector and
the membership reconciler may ask of a node, as one typed `Protocol`.

Where it sits: `broker.mgmt` (and through HTTP, `broker.cli`) talks to the
node only through a `ManagementPort`; the runtime implements it
(`broker.runtime.mgmt_port.NodePort`) and hands it to `start_servers`. This
module imports no runtime code: the port speaks in the metadata machine's
commands and records (`broker.metadata`), the queue machine's commands
(`broker.queue`), and the typed views and errors below. Tests build the
management application over an in-memory fake of it
(`tests/mgmt/test_port_fake.py`).

Errors: a refusal by the node is a `PortError(code, text)` subclass that
says what was refused (`MembershipRefused`: `code` is the HTTP status the
membership operation means; `QueueCommandFailed`: the AMQP reply code of a
queue command that was not applied; `PeerUnreachable`: another node did not
answer). Metadata refusals stay values (`md.MetadataError`), as the
metadata machine returns them.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import broker.metadata as md
import broker.queue as qm
from broker.common.config import Config
from broker.common.histogram import Histogram

#: A JSON object as the API shows it (RabbitMQ's shapes: connections,
#: channels, consumers, message_stats, long operations' result lines).
JsonObject = dict[str, Any]
#: Called with each result line of a long membership operation as it goes.
Progress = Callable[[JsonObject], None] | None


# ---------------------------------------------------------------- errors
class PortError(Exception):
    """A node's refusal: a `code` and a `text` (the message shown as is)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class MembershipRefused(PortError):
    """A membership operation refused; `code` is the HTTP status it means
    (400 bad request, 404 unknown, 409 wrong node or state, 503/504 not now)."""


class QueueCommandFailed(PortError):
    """A queue command that was not applied (the queue is gone, has no
    reachable leader, its group stopped); `code` is the AMQP reply code."""


class PeerUnreachable(PortError):
    """Another node did not answer a call (not connected, timed out, failed)."""


# ---------------------------------------------------------------- views
def _int(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _opt_int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """A queue's message and consumer counts (the queue machine's overview)."""

    messages: int = 0
    messages_ready: int = 0
    messages_unacknowledged: int = 0
    consumers: int = 0
    message_bytes_ready: int = 0
    message_bytes_unacknowledged: int = 0
    messages_dlx: int = 0
    message_bytes_dlx: int = 0
    delivery_limit: int | None = None

    @classmethod
    def of(cls, overview: Mapping[str, object]) -> QueueCounts:
        """From a queue machine's `overview()` (missing numbers are 0)."""
        return cls(
            _int(overview.get("messages")), _int(overview.get("messages_ready")),
            _int(overview.get("messages_unacknowledged")), _int(overview.get("consumers")),
            _int(overview.get("message_bytes_ready")),
            _int(overview.get("message_bytes_unacknowledged")),
            _int(overview.get("messages_dlx")), _int(overview.get("message_bytes_dlx")),
            _opt_int(overview.get("delivery_limit")))


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One member of a quorum queue as its leader sees it (quorum status)."""

    node: str
    voter: bool
    raft_state: str  # leader, follower, learner
    term: int
    commit_index: int
    last_applied: int | None
    match_index: int | None
    online: bool


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """This node: its name, AMQP port (0 while not listening), whether it is
    part of a cluster, and the metadata group as it sees it."""

    name: str
    amqp_port: int
    clustered: bool
    metadata_leader: str | None
    metadata_is_leader: bool
    metadata_voter: bool
    metadata_commit_index: int


@dataclass(frozen=True, slots=True)
class NodeResources:
    """A node's own answer about its resources and storage (None: unknown)."""

    node: str
    disk_free: int | None = None
    disk_free_limit: int | None = None
    mem_used: int | None = None
    mem_limit: int | None = None
    alarms: tuple[str, ...] = ()
    wal_bytes: int | None = None
    segment_files: int | None = None
    segment_bytes: int | None = None
    snapshot_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class AlarmStatus:
    """This node's picture of the cluster's resource alarms, and its own numbers."""

    local: frozenset[str]
    remote: Mapping[str, frozenset[str]]
    in_effect: tuple[Mapping[str, str], ...]  # {"node", "resource"} for each alarm anywhere
    disk_free: int | None
    disk_limit: int
    mem_used: int
    mem_limit: int

    def held_by(self, node: str, me: str) -> frozenset[str]:
        return self.local if node == me else self.remote.get(node, frozenset())


@dataclass(frozen=True, slots=True)
class NodeTotals:
    """One node's connection and channel counts and message stats."""

    connections: int
    channels: int
    message_stats: JsonObject | None


@dataclass(frozen=True, slots=True)
class QueueStatsPart:
    """One node's channels' message stats for one queue incarnation."""

    vhost: str
    name: str
    created_at: int
    message_stats: JsonObject


@dataclass(frozen=True, slots=True)
class MemberSample:
    """What the metrics sampler looks at on a local quorum member, cheaply."""

    vhost: str
    name: str
    applied_index: int
    last_applied_ms: int
    leader: str | None


@dataclass(frozen=True, slots=True)
class RaftMemberStatus:
    """A local quorum-queue member's Raft figures (metrics)."""

    vhost: str
    name: str
    is_leader: bool
    term: int
    commit_index: int
    applied_index: int
    last_index: int
    snapshot_index: int
    quiet: bool = False  # the group stopped ticking (runtime/quiesce.py)


@dataclass(frozen=True, slots=True)
class SegmentUsage:
    files: int
    bytes: int


@dataclass(frozen=True, slots=True)
class LiveAccounting:
    """A local quorum member's live messages (the storage manifest's view)."""

    vhost: str
    queue: str
    live_indexes: Sequence[int]  # sorted raft indexes of the entries holding live messages
    oldest_live_timestamp_ms: int | None
    oldest_live_holder: str | None
    live_messages: int = 0  # one entry may hold several (a batch entry)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message read back from a queue's log (or cache)."""

    properties: bytes
    body: bytes
    exchange: str
    routing_key: str


class QueueHandle(Protocol):
    """One queue process on this node (a member, a classic queue or a proxy
    to a remote leader), fixed at lookup: a later re-declaration is another queue."""

    @property
    def vhost(self) -> str: ...

    @property
    def name(self) -> str: ...

    async def command(self, cmd: qm.Command) -> object:
        """Submit `cmd` (re-proposed across leader changes); the machine's
        reply. Raises QueueCommandFailed."""
        ...

    def command_reliable(self, cmd: qm.Command, on_applied: Callable[[], None] | None = None) -> None:
        """Submit an idempotent command until applied or the queue is gone."""
        ...

    def message(self, key: int) -> StoredMessage: ...  # the body of a message its Dequeue took (qm.msg_key)

    def enqueue(self, properties: bytes, body: bytes, exchange: str, routing_key: str,
                priority: int | None, expiration_ms: int | None) -> Awaitable[object]:
        """An untracked enqueue (no publisher); awaiting it raises
        QueueCommandFailed when it was not enqueued. Raises QueueCommandFailed
        at once when the queue cannot take it (a stopped group)."""
        ...


# ---------------------------------------------------------------- the port
class NodePart(Protocol):
    """The node itself and the cluster it sees."""

    @property
    def node_name(self) -> str: ...

    @property
    def incarnation(self) -> str: ...

    @property
    def config(self) -> Config: ...

    def node_status(self) -> NodeStatus: ...

    def cluster_nodes(self) -> list[str]: ...

    def is_running(self, node: str) -> bool: ...

    def alarm_status(self) -> AlarmStatus: ...

    def stopped_members(self) -> dict[str, str]:
        """Raft groups (or queue members) on this node that stopped: id -> reason."""
        ...

    def wal_stats(self) -> Mapping[str, int]: ...

    def wal_sync_histogram(self) -> Histogram | None:
        """Each WAL batch's write + sync time (None before storage is open)."""
        ...


class ClusterPart(Protocol):
    """Questions to every connected node (this one included); a node that
    does not answer in time is left out."""

    async def cluster_totals(self) -> list[NodeTotals]: ...

    async def cluster_resources(self) -> list[NodeResources]: ...

    async def cluster_queue_stats(self, only: tuple[str, str] | None = None
                                  ) -> list[QueueStatsPart]: ...

    async def cluster_list(self, what: Literal["connections", "channels", "consumers"]
                           ) -> list[JsonObject]: ...

    async def queue_storage(self, vhost: str, name: str) -> list[JsonObject]:
        """Each replica's segment and snapshot files (nodes holding none left out)."""
        ...

    async def close_connection(self, node: str | None, name: str, reason: str) -> None:
        """Close connection `name` on `node` (None or this node: here).
        Raises PeerUnreachable."""
        ...


class MetadataPart(Protocol):
    """The local metadata replica (read-only) and commands to the metadata machine."""

    def metadata(self) -> md.MetadataState: ...

    async def meta_execute(self, cmd: md.Command) -> md.Reply | None: ...

    async def declare_queue(self, vhost: str, name: str, *, durable: bool, auto_delete: bool,
                            arguments: dict[str, Any]) -> md.Reply | None:
        """queue.declare as AMQP does it (type choice, placement, argument
        checks); answered once a new quorum queue has a leader."""
        ...

    async def delete_queue(self, vhost: str, name: str, if_unused: bool,
                           if_empty: bool) -> md.Reply | None: ...


class QueuePart(Protocol):
    """Queue processes on this node and their storage."""

    def queue_leader(self, record: md.QueueRecord) -> str | None:
        """The leader as the local member knows it, else as the record says."""
        ...

    def local_counts(self, vhost: str, name: str) -> QueueCounts | None:
        """Counts from a local replica; None when this node holds none."""
        ...

    def leader_counts(self, vhost: str, name: str) -> QueueCounts | None:
        """Counts when this node leads the queue (or holds the classic queue)."""
        ...

    def local_queue(self, vhost: str, name: str) -> QueueHandle | None: ...

    def borrow_channel(self, ref: str) -> None:
        """A channel reference used outside AMQP is open until given back."""
        ...

    def give_back_channel(self, ref: str) -> None: ...

    def member_samples(self, include_quiet: bool = True) -> list[MemberSample]:
        """Every local member's figures; without the quiet (idle) ones, whose
        figures do not move, when `include_quiet` is False."""
        ...

    def raft_members(self) -> list[RaftMemberStatus]: ...

    def segment_usage(self, vhost: str, name: str) -> SegmentUsage: ...

    def group_id(self, record: md.QueueRecord) -> str:
        """The storage group id of a quorum queue's member."""
        ...

    def data_dir(self) -> str:
        """The storage directory (for the storage manifest)."""
        ...

    def live_accounting(self) -> dict[str, LiveAccounting]:
        """Per storage group id of a local quorum member: its live messages."""
        ...


class MembershipPart(Protocol):
    """Quorum-queue membership; every refusal raises MembershipRefused."""

    async def quorum_status(self, vhost: str, name: str) -> list[MemberStatus]: ...

    async def remote_counts(self, vhost: str, name: str) -> QueueCounts:
        """The leader's counts, asked where it is."""
        ...

    def quorum_critical(self, node: str) -> list[tuple[str, str]]:
        """(vhost, name) of quorum queues that lose their quorum without `node`."""
        ...

    async def add_member(self, vhost: str, name: str, node: str) -> None: ...

    async def delete_member(self, vhost: str, name: str, node: str, force: bool = False) -> None: ...

    async def transfer_leader(self, vhost: str, name: str, node: str) -> None: ...

    async def grow(self, node: str, strategy: str, vhost_pattern: str, queue_pattern: str,
                   progress: Progress = None) -> list[JsonObject]: ...

    async def shrink(self, node: str, errors_only: bool,
                     progress: Progress = None) -> list[JsonObject]: ...

    async def rebalance(self, vhost_pattern: str, queue_pattern: str,
                        progress: Progress = None) -> list[JsonObject]: ...

    async def drain(self, node: str, exclude: set[str],
                    progress: Progress = None) -> list[JsonObject]: ...

    async def hand_off_leaders(self, node: str, progress: Progress = None) -> list[JsonObject]: ...

    async def forget_node(self, node: str) -> None: ...


class ManagementPort(NodePart, ClusterPart, MetadataPart, QueuePart, MembershipPart, Protocol):
    """Everything `broker.mgmt` asks of a node."""


__all__ = [
    "AlarmStatus", "ClusterPart", "JsonObject", "LiveAccounting", "ManagementPort",
    "MemberSample", "MemberStatus", "MembershipPart", "MembershipRefused", "MetadataPart",
    "NodePart", "NodeResources", "NodeStatus", "NodeTotals", "PeerUnreachable", "PortError",
    "Progress", "QueueCommandFailed", "QueueCounts", "QueueHandle", "QueuePart",
    "QueueStatsPart", "RaftMemberStatus", "SegmentUsage", "StoredMessage",
]
