"""Errors raised by the queue state machine package.

`QueueArgumentError` is the client's fault (bad x-arguments or policy values)
and carries the AMQP channel-close code and text RabbitMQ uses.
`QueueCommandError` is a malformed command (the runtime's fault).
`QueueInvariantError` is a broken internal invariant: the runtime must stop
this queue's Raft group (not the node).
"""
from __future__ import annotations


class QueueError(Exception):
    """Base class of every error raised by `broker.queue`."""


class QueueArgumentError(QueueError):
    """Refused queue declaration/policy: AMQP channel error (406 by default)."""

    def __init__(self, reply_text: str, reply_code: int = 406) -> None:
        super().__init__(reply_text)
        self.reply_code = reply_code
        self.reply_text = reply_text


class QueueCommandError(QueueError):
    """A command whose fields are out of range or of the wrong type."""


class QueueInvariantError(QueueError):
    """The state broke one of its invariants; stop this queue's Raft group."""


class SnapshotError(QueueError):
    """Snapshot bytes that cannot be decoded into a queue state."""
