"""Membership operations (runtime/membership.py) against a fake node: a
change is refused up front while the node's metadata group is stopped, so
Raft and the metadata never disagree because the record could not be written."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from broker import metadata as md
from broker import storage as st
from broker.runtime.membership import Membership, MembershipError, RaftConfigReport


class FakeNode:
    node_name = "a"

    def __init__(self, record: md.QueueRecord, stopped: BaseException | None) -> None:
        self.meta = SimpleNamespace(group=SimpleNamespace(stopped=stopped), state=md.new_state())
        self.registry = SimpleNamespace(queue_record=lambda vhost, name: record)
        self.calls: list[Any] = []

    def cluster_nodes(self) -> list[str]:
        return ["a", "b", "c"]

    def peer_connected(self, node: str) -> bool:
        return True

    def queue(self, vhost: str, name: str) -> Any:
        return None

    def queue_leader(self, vhost: str, name: str) -> str:
        return "a"

    async def submit_as_leader(self, vhost: str, name: str, payload: Any) -> Any:
        self.calls.append(payload)
        if payload[1] == "config":
            return RaftConfigReport(("a", "b"), ("a", "b"), 7).wire()
        return RaftConfigReport(("a",), ("a",), 8).wire()  # b removed

    def forward(self, *a: Any) -> Any:
        raise AssertionError("the leader is here")

    async def meta_execute(self, cmd: md.Command) -> md.Reply:
        self.calls.append(cmd)
        return md.Ok()


def _record() -> md.QueueRecord:
    return md.QueueRecord(md.VhostName("/"), md.QueueName("q"), "quorum", True, False, None,
                          md.freeze_table({}), (md.NodeName("a"), md.NodeName("b")), md.NodeName("a"), 1)


def test_a_change_is_refused_while_the_metadata_group_is_stopped() -> None:
    node = FakeNode(_record(), st.StorageIOError(28, "No space left on device"))
    with pytest.raises(MembershipError) as info:
        asyncio.run(Membership(node).delete_member("/", "q", "b"))
    assert info.value.status == 503 and "metadata store on node 'a' is stopped" in str(info.value)
    assert [c for c in node.calls if not (isinstance(c, list) and c[1] == "config")] == []


def test_with_the_metadata_group_running_the_change_is_made_and_recorded() -> None:
    node = FakeNode(_record(), None)
    asyncio.run(Membership(node).delete_member("/", "q", "b", force=True))
    assert ["M", "remove", "b"] in node.calls
    assert any(isinstance(c, md.SetQueueMembers) for c in node.calls)
