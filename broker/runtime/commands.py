"""Queue commands and at-most-once dead lettering: how the node gets a
command applied by a queue, whichever process serves the queue right now.

Where it sits: a collaborator of the node (`Node.commands`). Channels, the
management port and the dead-letter workers hand it queue commands:

- `queue_command`: one command whose reply the caller waits for (consume,
  get, purge, ...); a proposal replaced by a new leader's entry is proposed
  again for up to 30 s; failures become `ChannelError(404)`.
- `queue_command_reliable`: an idempotent command (settle, return, discard,
  channel down, policy update) re-submitted with a backoff until applied or
  the queue is gone; `commands_settled` waits until none of this node's is
  left for a queue (declare-ok/delete-ok counts include returned messages).
- `submit_enqueue`: a publisher session's enqueue through the queue's
  current process (runtime/publish.py owns the numbering and re-sends).
- `remember_dequeued` / `dequeued_message`: the body of a basic.get, shipped
  with a remote leader's reply or read from this node's replica.
- `dead_letter`: at-most-once dead lettering (republish with x-death, no
  confirms); at-least-once is runtime/dead_letter.py's `DlxWorker`.

Commands always go to the queue's *current* process, found by its identity
(`QueueUid`) through the registry: a membership change replaces processes,
never the queue.

It sees the node through `CommandsHost`, so it is unit-tested against fakes
(tests/runtime/test_commands.py).
May import: the pure cores, storage errors, `wire`, `backoff`, `errors`,
`dead_letter`'s message builders, the queue process types.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from functools import partial
from typing import Any, Protocol

import broker.metadata as md
import broker.queue as qm
import broker.runtime.wire as wire
import broker.storage as st

from .background import log_failure
from .backoff import Backoff
from .dead_letter import dead_letter_message, dl_cycle
from .errors import ChannelError, QueueGone
from .queues import Message, QueueProcess, QueueUid
from .raft_group import ProposalReplaced

log = logging.getLogger("broker.commands")


class LiveQueues(Protocol):
    """The node's queue processes (runtime/registry.py `Registry`)."""

    def queue(self, vhost: str, name: str) -> QueueProcess | None: ...

    def live_queue(self, uid: QueueUid) -> QueueProcess | None: ...


class CommandsHost(Protocol):
    @property
    def registry(self) -> LiveQueues: ...

    @property
    def meta_state(self) -> md.MetadataState: ...


class Commands:
    def __init__(self, host: CommandsHost) -> None:
        self.host = host
        # Reliable queue commands not yet applied (or the queue gone), per
        # queue, and who waits for none to be left (commands_settled).
        self._reliable_open: dict[QueueUid, int] = {}
        self._reliable_waiters: dict[QueueUid, list[asyncio.Future[None]]] = {}
        self._dequeued_bodies: dict[tuple[str, str, int], Message] = {}

    def live_queue(self, uid: QueueUid) -> QueueProcess | None:
        return self.host.registry.live_queue(uid)

    # ------------------------------------------------------------ one command, one reply
    async def queue_command(self, q: QueueProcess, cmd: qm.Command) -> Any:
        # A command proposed here and then overwritten by a new leader was never
        # applied: propose it again (to the new leader) until it is, for a while.
        uid = q.uid
        deadline = time.monotonic() + 30
        while True:
            cur = self.live_queue(uid)
            if cur is None:
                raise ChannelError(404, f"queue '{q.name}' in vhost '{q.vhost}' is gone")
            try:
                return await cur.command(cmd)
            except ChannelError:
                raise
            except ProposalReplaced as replaced:
                if time.monotonic() > deadline:
                    raise ChannelError(404, f"queue '{q.name}' in vhost '{q.vhost}' is unavailable: "
                                            f"{replaced}") from None
                await asyncio.sleep(0.05)
            except Exception as exc:
                raise ChannelError(404, f"queue '{q.name}' in vhost '{q.vhost}' is unavailable: "
                                        f"{exc}") from None

    # ------------------------------------------------------------ re-sent until applied
    def queue_command_reliable(self, uid: QueueUid, cmd: qm.Command,
                               on_applied: Any = None) -> None:
        """Submit an idempotent command (settle, return, discard, channel down)
        until it is applied or the queue is gone: a leader change, a replaced
        entry or a lost connection re-sends it. `on_applied()` runs once it is
        applied (not when the queue is gone)."""
        self._reliable_open[uid] = self._reliable_open.get(uid, 0) + 1
        _ReliableCommand(self, uid, wire.payload_for(cmd), on_applied).submit()

    def _reliable_finished(self, uid: QueueUid) -> None:
        left = self._reliable_open.get(uid, 1) - 1
        if left > 0:
            self._reliable_open[uid] = left
            return
        self._reliable_open.pop(uid, None)
        for fut in self._reliable_waiters.pop(uid, ()):
            if not fut.done():
                fut.set_result(None)

    async def commands_settled(self, uid: QueueUid, timeout: float = 5.0) -> None:
        """Wait (at most `timeout`) until the reliable commands this node sent
        to the queue are applied: a closed channel's messages are back in the
        queue before the counts of a later queue.delete or queue.declare are
        read, as in RabbitMQ, where a channel's queues learn of its end before
        the channel is gone."""
        if not self._reliable_open.get(uid):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reliable_waiters.setdefault(uid, []).append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            log.debug("queue %s: commands still unapplied after %.1f s", uid[1], timeout)

    # ------------------------------------------------------------ publishes, gets
    def submit_enqueue(self, uid: QueueUid, payload: list[Any]) -> asyncio.Future[Any]:
        """A publisher session's enqueue, routed by the queue's current process
        (a local leader proposes it, anything else forwards it)."""
        q = self.host.registry.live_queue(uid)
        if q is None:
            raise QueueGone(f"queue '{uid[1]}' in vhost '{uid[0]}' is gone")
        return q._submit(payload)

    def remember_dequeued(self, vhost: str, name: str, key: int, msg: Message) -> None:
        """A basic.get's body (message `key`), read as its Dequeue was applied
        by the leader here, or shipped by a leader on another node."""
        bodies = self._dequeued_bodies
        bodies[(vhost, name, key)] = msg
        while len(bodies) > 1024:  # a get reads its body at once; bound stragglers
            bodies.pop(next(iter(bodies)))

    def dequeued_message(self, q: QueueProcess, key: int) -> Message | None:
        """The body of a message a basic.get dequeued: shipped with the reply,
        or read from this node's replica (the current one: a membership change
        may have replaced the process), or None when it is not here."""
        msg = self._dequeued_bodies.pop((q.vhost, q.name, key), None)
        if msg is not None:
            return msg
        for cand in (q, self.live_queue(q.uid)):
            if cand is None:
                continue
            try:
                return cand.message(key)
            except (KeyError, IndexError, ValueError, st.StorageError):
                continue
        return None

    # ------------------------------------------------------------ dead lettering
    def dead_letter(self, vhost: str, exchange: str, routing_key: str | None,
                    messages: list[tuple[Message, dict[str, Any]]]) -> None:
        """At-most-once dead lettering: republish with x-death headers, no confirms."""
        for msg, death in messages:
            props, body, rk, headers, priority = dead_letter_message(msg, death, routing_key)
            routed = md.route(self.host.meta_state, md.VhostName(vhost), exchange, rk, headers)
            if isinstance(routed, md.MetadataError):
                continue
            targets: Iterable[str] = routed
            if death["reason"] != "rejected":  # RabbitMQ drops automatic cycles
                targets = [q for q in routed if not dl_cycle(q, headers.get("x-death"))]
            for qname in targets:
                target = self.host.registry.queue(vhost, qname)
                if target is None or target.deleted:
                    continue
                try:
                    fut = target.enqueue(None, 0, props, body, exchange, rk, priority, None)
                    fut.add_done_callback(partial(log_failure, f"dead letter to {qname}",
                                                  logging.DEBUG))
                except Exception as exc:
                    log.warning("dead letter to %s failed: %s", qname, exc)


class _ReliableOwner(Protocol):
    def live_queue(self, uid: QueueUid) -> QueueProcess | None: ...

    def _reliable_finished(self, uid: QueueUid) -> None: ...


class _ReliableCommand:
    """One idempotent queue command re-submitted until applied (see
    Commands.queue_command_reliable). Retries back off from 10 ms to 1 s."""

    __slots__ = ("owner", "uid", "payload", "on_applied", "backoff")

    def __init__(self, owner: _ReliableOwner, uid: QueueUid, payload: list[Any],
                 on_applied: Any) -> None:
        self.owner = owner
        self.uid = uid
        self.payload = payload
        self.on_applied = on_applied
        self.backoff = Backoff(0.01, 1.0)

    def submit(self) -> None:
        q = self.owner.live_queue(self.uid)
        if q is None:
            self.owner._reliable_finished(self.uid)
            return  # the queue is gone: nothing left to settle
        try:
            fut = q._submit(self.payload)
        except Exception as exc:  # noqa: BLE001 - not leader at this instant, stopped group
            log.debug("queue %s: command not submitted yet: %s", q.name, exc)
            self._again()
            return
        fut.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self.owner._reliable_finished(self.uid)
            if self.on_applied is not None:
                self.on_applied()
            return
        exc = None if fut.cancelled() else fut.exception()
        if isinstance(exc, QueueGone):
            self.owner._reliable_finished(self.uid)
            return
        log.debug("queue command to be re-sent: %s", exc)
        self._again()

    def _again(self) -> None:
        if self.owner.live_queue(self.uid) is None:
            self.owner._reliable_finished(self.uid)
            return
        asyncio.get_running_loop().call_later(self.backoff.next(), self.submit)

