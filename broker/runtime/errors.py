"""Errors shared by the runtime's collaborators (what they mean, whose fault).

Where it sits: raised and caught inside `broker.runtime`; the management API
and the AMQP channel translate them into HTTP statuses and reply codes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ChannelError(Exception):
    """A channel-level AMQP error (channel.close with `code` and `text`,
    naming the failed method). Raised by the channel's handlers and by the
    queue command path (runtime/commands.py); the management port turns it
    into an HTTP status. `ConnectionError_` (runtime/channel.py) is the
    connection-level kind."""

    def __init__(self, code: int, text: str, method: Any = None) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        idx = getattr(method, "index", 0) or 0
        self.class_id = idx >> 16
        self.method_id = idx & 0xFFFF


class QueueGone(Exception):
    """The queue a command was meant for no longer exists (deleted, or
    re-declared as a new incarnation): the command can never be applied.
    Final: callers fail (nack) instead of re-sending."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A queue leader's final "no" to a membership control request (the
    change itself is not allowed: unknown node, last voter, lagging peer...).
    A reply value, not an exception: it travels back to a forwarding node as
    one (cluster reply codec). Transient refusals (a change or transfer still
    in progress) are retried instead, never answered with this."""

    reason: str


__all__ = ["ChannelError", "QueueGone", "Refused"]
