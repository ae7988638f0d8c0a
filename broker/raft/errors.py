"""Errors raised by the Raft core.

Whose fault: `NotLeader`, `ProposalDropped`, `InvalidConfChange`,
`TransferRefused` and `RaftUsageError` are the caller's (retry, forward, or fix
the call); `Compacted`/`Unavailable` are storage answers the core handles;
`InvariantViolation` means the group's state is broken (a bug, or corrupt
storage): the host must stop this Raft group, never carry on.
"""
from __future__ import annotations


class RaftError(Exception):
    """Base class of everything the Raft core raises."""


class NotLeader(RaftError):
    """A proposal (or leader-only call) reached a node that is not the leader.
    `leader_id` is the leader this node knows of (None if unknown) so the
    caller can forward."""

    def __init__(self, leader_id: str | None) -> None:
        super().__init__(f"not the leader; leader is {leader_id!r}")
        self.leader_id = leader_id


class ProposalDropped(RaftError):
    """The leader cannot take a proposal right now (e.g. leadership transfer
    in progress, or it was removed from the group); retry later."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidConfChange(RaftError):
    """A membership change that is not allowed (one at a time, unknown node,
    removing the last voter, promoting a non-learner...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TransferRefused(RaftError):
    """Leadership transfer refused (unknown node, learner, lagging peer...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ConfChangePending(InvalidConfChange):
    """Another configuration change (or the new leader's first entry) is not
    committed yet: this one is fine, only too early. Retry later."""


class TransferInProgress(TransferRefused):
    """A leadership transfer is already under way. Retry later."""


class RaftUsageError(RaftError):
    """The host broke the API contract (e.g. advanced Readies out of order)."""


class StorageError(RaftError):
    """Base for the answers a LogStorage gives for indexes it cannot serve."""


class Compacted(StorageError):
    """The requested index is below the storage's first index (in a snapshot)."""


class Unavailable(StorageError):
    """The requested index is beyond the storage's last index."""


class InvariantViolation(RaftError):
    """A Raft invariant is broken (e.g. a committed entry would be overwritten).
    Stop the group: continuing could corrupt replicated state."""
