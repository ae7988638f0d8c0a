"""Errors shared by the runtime's collaborators (what they mean, whose fault).

Where it sits: raised and caught inside `broker.runtime`; the management API
and the AMQP channel translate them into HTTP statuses and reply codes.
"""
from __future__ import annotations


class QueueGone(Exception):
    """The queue a command was meant for no longer exists (deleted, or
    re-declared as a new incarnation): the command can never be applied.
    Final: callers fail (nack) instead of re-sending."""


__all__ = ["QueueGone"]
