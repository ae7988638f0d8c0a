"""membership.control on a queue leader: Raft's refusals come back typed.

A final refusal (the change is not allowed) is a `Refused` reply value, which
also survives the cluster reply codec (a forwarded request gets the same);
a transient one (another change or a transfer still in progress) raises, so
the caller's retry loop asks again. Nothing is recognised by its wording.
"""
from __future__ import annotations

from typing import Any

import pytest

from broker.raft import (
    ConfChangePending,
    InvalidConfChange,
    ProposalDropped,
    TransferInProgress,
    TransferRefused,
)
from broker.raft.progress import Progress
from broker.runtime.cluster import decode_reply, encode_reply
from broker.runtime.errors import Refused
from broker.runtime.membership import control


class _RaftNode:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.progress: dict[str, Progress] = {}  # the leader's view of its followers
        self.commit_index = 5

    def transfer_leadership(self, target: str) -> None:
        raise self.exc


class _Group:
    """The two calls control() makes on a queue's Raft group."""

    def __init__(self, exc: BaseException) -> None:
        self.node = _RaftNode(exc)
        self.exc = exc

    def propose_conf(self, cc: Any) -> Any:
        raise self.exc

    def _kick(self) -> None:
        pass


class _Queue:
    def __init__(self, exc: BaseException) -> None:
        self.group = _Group(exc)


@pytest.mark.parametrize(("op", "exc"), [
    ("add", InvalidConfChange("node n2 is already a member")),
    ("remove", InvalidConfChange("cannot remove the last voter")),
    ("transfer", TransferRefused("n3 is a learner, not a voter")),
])
def test_a_final_refusal_is_a_typed_reply_that_survives_the_wire(op: str, exc: Exception) -> None:
    result = control(_Queue(exc), ["M", op, "n2"])
    assert result == Refused(str(exc))
    assert decode_reply(encode_reply(result)) == result


@pytest.mark.parametrize(("op", "exc"), [
    ("add", ConfChangePending("a configuration change is still uncommitted")),
    ("remove", ProposalDropped("leadership transfer to n3 in progress")),
    ("transfer", TransferInProgress("a transfer to n3 is in progress")),
])
def test_a_transient_refusal_raises_so_the_caller_retries(op: str, exc: Exception) -> None:
    with pytest.raises(RuntimeError, match=str(exc)):
        control(_Queue(exc), ["M", op, "n2"])


def test_a_transfer_to_a_follower_still_catching_up_is_retried() -> None:
    """The core refuses a target behind the commit index; when it answers
    (recent_active) it is only an entry or two behind: transient, retried,
    not a 409 to the operator."""
    q = _Queue(AssertionError("transfer_leadership must not be called yet"))
    behind = Progress(6, 256, False)
    behind.match = 4
    q.group.node.progress["n2"] = behind
    with pytest.raises(RuntimeError, match="catching up"):
        control(q, ["M", "transfer", "n2"])
    behind.recent_active = False  # silent: the core's final refusal stands
    q.group.node.exc = TransferRefused("n2 is lagging (match 4 < commit 5) or unreachable")
    assert control(q, ["M", "transfer", "n2"]) == Refused("n2 is lagging (match 4 < commit 5) or unreachable")
