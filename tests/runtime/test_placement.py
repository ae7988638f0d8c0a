"""Placement of a new queue's members and leader (runtime/placement.py): a
pure function, table-tested."""
from __future__ import annotations

from typing import Any

import pytest

from broker import metadata as md
from broker.runtime.placement import place

NODES = ["n1", "n2", "n3", "n4", "n5"]


def rec(name: str, members: tuple[str, ...], leader: str) -> md.QueueRecord:
    return md.QueueRecord(md.VhostName("/"), md.QueueName(name), "quorum", True, False, None,
                          md.freeze_table({}), tuple(md.NodeName(m) for m in members),
                          md.NodeName(leader), 1)


def run(me: str = "n1", records: list[md.QueueRecord] | None = None, args: dict[str, Any] | None = None,
        down: set[str] | None = None, quorum: bool = True, size: int = 3,
        locator: str = "client-local", nodes: list[str] = NODES) -> tuple[tuple[str, ...], str]:
    members, leader = place(me, nodes, lambda n: n not in (down or set()), records or [],
                            args or {}, quorum=quorum, default_size=size, default_locator=locator)
    return tuple(members), leader


def test_classic_queues_stay_on_the_declaring_node() -> None:
    assert run("n3", quorum=False) == (("n3",), "n3")


def test_a_single_node_cluster_places_everything_here() -> None:
    assert run("n1", nodes=["n1"], size=3) == (("n1",), "n1")


def test_the_declaring_node_plus_the_least_loaded_others() -> None:
    records = [rec("a", ("n2", "n3", "n4"), "n2"), rec("b", ("n2", "n3", "n5"), "n3")]
    assert run("n1", records) == (("n1", "n4", "n5"), "n1")


def test_unreachable_nodes_come_last() -> None:
    assert run("n1", down={"n2", "n3"}) == (("n1", "n4", "n5"), "n1")


@pytest.mark.parametrize(("args", "size", "expected"), [
    ({}, 3, 3), ({"x-quorum-initial-group-size": 5}, 3, 5),
    ({"x-quorum-initial-group-size": 9}, 3, 5),  # capped at the cluster size
    ({"x-quorum-initial-group-size": 1}, 3, 1), ({}, 7, 5),
])
def test_group_size(args: dict[str, Any], size: int, expected: int) -> None:
    members, _ = run("n2", args=args, size=size)
    assert len(members) == expected and members[0] == "n2"


def test_balanced_leader_is_the_member_leading_fewest_queues() -> None:
    records = [rec("a", ("n1", "n2", "n3"), "n1"), rec("b", ("n1", "n2", "n3"), "n1"),
               rec("c", ("n1", "n2", "n3"), "n2")]
    members, leader = run("n1", records, args={"x-queue-leader-locator": "balanced"})
    assert leader in members and leader not in ("n1", "n2")  # n1 leads 2, n2 leads 1
    _, leader = run("n1", [], locator="balanced")
    assert leader == "n1"  # ties go to the declaring node
