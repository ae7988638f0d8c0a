"""Queue declarations and deletions: what the node does for queue.declare,
queue.delete, auto-delete, exclusive queues of a closed connection and
expired queues.

Where it sits: a collaborator of the node (`Node.declarations`), called by
the AMQP channel, the management API and the definitions import. It chooses
the queue type (the vhost's or node's default for durable, shared queues;
temporaries stay classic, as RabbitMQ 3.12+/4.x do), checks quorum-queue
arguments, places members and leader (runtime/placement.py), and turns all
of it into metadata commands (`DeclareQueue`, `DeleteQueue`,
`DeleteExclusiveQueues`) executed through the metadata group. Refusals come
back as `md.MetadataError` replies, the same for every caller; nothing here
knows AMQP frames or HTTP.

It sees the node through `DeclarationsHost`, so it is unit-tested with the
real metadata machine and no process (tests/runtime/test_declarations.py).
May import: the pure cores, placement.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping, Sized
from typing import Any, Protocol

import broker.metadata as md
import broker.queue as qm
from broker.common.config import Config

from .background import spawn
from .placement import place


class DeclaredQueue(Protocol):
    """A local queue process, as far as declare/delete/auto-delete look at it."""

    @property
    def uid(self) -> tuple[str, str, int]: ...
    @property
    def vhost(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def consumers(self) -> Sized: ...
    @property
    def deleted(self) -> bool: ...
    @property
    def had_consumer(self) -> bool: ...
    def overview(self) -> Mapping[str, Any]: ...  # JSON-shaped counts


class DeclarationsHost(Protocol):
    node_name: str

    @property
    def config(self) -> Config: ...

    @property
    def meta_state(self) -> md.MetadataState: ...

    async def meta_execute(self, cmd: md.Command) -> md.Reply | None: ...

    def cluster_nodes(self) -> Collection[str]: ...

    def peer_connected(self, node: str) -> bool: ...

    def queue(self, vhost: str, name: str) -> DeclaredQueue | None: ...

    async def wait_for_leader(self, q: DeclaredQueue | None, vhost: str, name: str) -> None: ...

    async def commands_settled(self, uid: tuple[str, str, int], timeout: float = 5.0) -> None: ...


def reply_detail(reply_text: str) -> str:
    """'NAME - detail' -> 'detail' (replies carry the NAME prefix separately)."""
    head, sep, tail = reply_text.partition(" - ")
    return tail if sep and head.isupper() else reply_text


def qq_args(args: dict[str, Any]) -> dict[str, Any]:
    """RabbitMQ accepts x-overflow=reject-publish-dlx on a quorum queue, logs a
    warning and uses the default (drop-head) (rabbit_quorum_queue:overflow/3);
    broker.queue refuses it, so it is dropped before parsing. The stored
    arguments keep it (redeclarations compare them)."""
    if args.get("x-overflow") in ("reject-publish-dlx", b"reject-publish-dlx"):
        return {k: v for k, v in args.items() if k != "x-overflow"}
    return args


#: a classic queue's arguments checked at declaration as a quorum queue's
#: are (RabbitMQ 3.10 answers the same 406 texts for both)
_CLASSIC_CHECKED = ("x-dead-letter-exchange", "x-dead-letter-routing-key")


class Declarations:
    def __init__(self, host: DeclarationsHost) -> None:
        self.host = host

    @staticmethod
    def server_queue_name() -> str:
        return f"amq.gen-{os.urandom(12).hex()}"

    async def declare_queue(self, vhost: str, name: str, *, durable: bool,
                            exclusive_owner: str | None, auto_delete: bool,
                            arguments: dict[str, Any], passive: bool,
                            server_named: bool) -> md.Reply | None:
        """queue.declare: the metadata's reply (`QueueDeclareOk` or a
        `MetadataError`); a new quorum queue is answered once it has a leader."""
        host = self.host
        state = host.meta_state
        cfg = host.config
        existing = state.queues.get((md.VhostName(vhost), md.QueueName(name)))
        qtype = arguments.get("x-queue-type")
        if qtype is None and existing is None and not passive:
            vh = state.vhosts.get(md.VhostName(vhost))
            qtype = getattr(vh, "default_queue_type", None) or cfg["default_queue_type"]
            if exclusive_owner is not None or server_named or not durable or auto_delete:
                # temporaries (exclusive, server-named, transient, auto-delete) stay
                # classic when quorum is the default, as in RabbitMQ 3.12+/4.x
                qtype = "classic"
            arguments = {**arguments, "x-queue-type": qtype} if qtype == "quorum" else arguments
        if not passive and existing is None:
            # a quorum queue's arguments all; a classic queue's dead-letter
            # target (RabbitMQ checks their types for every queue type: an
            # int exchange name is refused with 406, not kept)
            checked = qq_args(arguments) if qtype == "quorum" else \
                {k: v for k, v in arguments.items() if k in _CLASSIC_CHECKED}
            try:
                qm.parse_queue_arguments(checked, name, vhost)
            except qm.QueueArgumentError as exc:
                return md.MetadataError(exc.reply_code, reply_detail(exc.reply_text))
        members, leader = place(
            host.node_name, host.cluster_nodes(), host.peer_connected, state.queues.values(),
            arguments, quorum=qtype == "quorum" and existing is None,
            default_size=cfg["quorum_queue.initial_cluster_size"],
            default_locator=cfg["queue_leader_locator"])
        cmd = md.DeclareQueue(
            md.VhostName(vhost), md.QueueName(name), durable, exclusive_owner, auto_delete,
            md.freeze_table(arguments), passive, server_named, members, leader,
            cfg["quorum_queue.property_equivalence.relaxed_checks_on_redeclaration"])
        reply = await host.meta_execute(cmd)
        if isinstance(reply, md.MetadataError):
            return reply
        await host.wait_for_leader(host.queue(vhost, name), vhost, name)
        return reply

    async def delete_queue(self, vhost: str, name: str, if_unused: bool, if_empty: bool,
                           owner: str | None) -> tuple[md.Reply | None, int]:
        """queue.delete: (the metadata's reply, the ready messages it held)."""
        q = self.host.queue(vhost, name)
        if q is not None:
            await self.host.commands_settled(q.uid)  # a closed channel's returns count
        consumers = len(q.consumers) if q is not None else 0
        # RabbitMQ counts ready messages (if-empty and delete-ok), not unacked ones
        count: int = q.overview().get("messages_ready", 0) if q is not None else 0
        reply = await self.host.meta_execute(md.DeleteQueue(
            md.VhostName(vhost), md.QueueName(name), if_unused, if_empty, consumers, count, owner))
        return reply, count

    def _record(self, vhost: str, name: str) -> md.QueueRecord | None:
        return self.host.meta_state.queues.get((md.VhostName(vhost), md.QueueName(name)))

    async def maybe_auto_delete(self, q: DeclaredQueue) -> None:
        record = self._record(q.vhost, q.name)
        if record is None or not record.auto_delete or q.consumers or q.deleted:
            return
        await self.host.meta_execute(md.DeleteQueue(md.VhostName(q.vhost), md.QueueName(q.name)))

    def schedule_auto_delete_check(self, q: DeclaredQueue) -> None:
        record = self._record(q.vhost, q.name)
        if record is None or not record.auto_delete or q.consumers:
            return
        # RabbitMQ deletes an auto-delete queue when its last consumer goes,
        # never before it had one.
        if q.had_consumer:
            spawn(self.maybe_auto_delete(q), "auto-delete check", logging.WARNING)

    def connection_closed(self, conn_id: str) -> None:
        """Exclusive queues of a closed connection are deleted."""
        if any(r.exclusive_owner == conn_id for r in self.host.meta_state.queues.values()):
            spawn(self.host.meta_execute(md.DeleteExclusiveQueues(conn_id)),
                  "deleting exclusive queues", logging.WARNING)

    def queue_expired(self, vhost: str, name: str) -> None:
        spawn(self.host.meta_execute(md.DeleteQueue(md.VhostName(vhost), md.QueueName(name))),
              "deleting an expired queue", logging.WARNING)


__all__ = ["Declarations", "DeclarationsHost", "qq_args", "reply_detail"]
