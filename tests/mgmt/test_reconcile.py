"""Continuous membership reconciliation: the pure plan as a table, then a real
3-node cluster with CMR enabled growing queues to their target sizes."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.mgmt.reconcile import AddMember, QueueMembers, RemoveMember, plan

from .conftest import Api, MgmtCluster, wait_for

N1, N2, N3, N4 = "n1", "n2", "n3", "n4"


@pytest.mark.parametrize(("queues", "online", "auto_remove", "expected"), [
    # below target: grow onto online non-members, least loaded first
    ([QueueMembers("/", "a", (N1,), 3)], [N1, N2, N3], False,
     [AddMember("/", "a", N2), AddMember("/", "a", N3)]),
    # at or above target: nothing (CMR never shrinks)
    ([QueueMembers("/", "a", (N1, N2, N3), 3)], [N1, N2, N3], False, []),
    ([QueueMembers("/", "a", (N1, N2, N3), 2)], [N1, N2, N3], False, []),
    # offline nodes are not candidates
    ([QueueMembers("/", "a", (N1,), 3)], [N1, N3], False, [AddMember("/", "a", N3)]),
    # load spreads across consecutive queues (n2 gets the first, n3 the second)
    ([QueueMembers("/", "a", (N1,), 2), QueueMembers("/", "b", (N1,), 2)], [N1, N2, N3], False,
     [AddMember("/", "a", N2), AddMember("/", "b", N3)]),
    # a departed node's member stays without auto_remove ...
    ([QueueMembers("/", "a", (N1, N4), 3)], [N1, N2, N3], False, [AddMember("/", "a", N2)]),
    # ... and goes with it, making room for two new members
    ([QueueMembers("/", "a", (N1, N4), 3)], [N1, N2, N3], True,
     [RemoveMember("/", "a", N4), AddMember("/", "a", N2), AddMember("/", "a", N3)]),
    # never the last member, even on a departed node
    ([QueueMembers("/", "a", (N4,), 1)], [N1, N2, N3], True, []),
])
def test_plan(queues: list[QueueMembers], online: list[str], auto_remove: bool,
              expected: list[object]) -> None:
    assert plan(queues, [N1, N2, N3], online, auto_remove) == expected


def test_plan_uses_given_load() -> None:
    q = [QueueMembers("/", "a", (N1,), 2)]
    assert plan(q, [N1, N2, N3], [N1, N2, N3], False, {N1: 1, N2: 5, N3: 1}) == [
        AddMember("/", "a", N3)]


@pytest.fixture(scope="module")
def cmr_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtCluster]:
    prefix = "quorum_queue.continuous_membership_reconciliation"
    c = MgmtCluster(tmp_path_factory.mktemp("cmr") / "c", extra=(
        f"{prefix}.enabled = true\n{prefix}.target_group_size = 2\n"
        f"{prefix}.interval = 1000\n{prefix}.trigger_interval = 200\n"))
    c.start()
    yield c
    c.kill_all()


def test_queues_grow_to_their_target_sizes(cmr_cluster: MgmtCluster, tmp_path: Path) -> None:
    c = cmr_cluster
    a0, a1, _ = c.apis
    one = {"arguments": {"x-queue-type": "quorum", "x-quorum-initial-group-size": 1}}

    def members(name: str, api: Api = a1) -> list[str]:
        status, body = api.get(f"/api/queues/%2F/{name}")
        return sorted(body["members"]) if status == 200 else []
    assert a0.put("/api/queues/%2F/cmr-a", one)[0] == 201
    wait_for(lambda: len(members("cmr-a")) == 2, timeout=30, what="cmr-a grown to 2 (config)")
    # the argument sets a queue's own target
    arg3 = {"arguments": {**one["arguments"], "x-quorum-target-group-size": 3}}
    assert a0.put("/api/queues/%2F/cmr-b", arg3)[0] == 201
    wait_for(lambda: members("cmr-b") == sorted(c.names), timeout=30, what="cmr-b grown to 3")
    # a policy change triggers a round: cmr-a goes to 3
    policy = {"pattern": "^cmr-a$", "definition": {"target-group-size": 3}, "apply-to": "queues"}
    assert a0.put("/api/policies/%2F/cmr-target", policy)[0] == 201
    wait_for(lambda: members("cmr-a") == sorted(c.names), timeout=30, what="cmr-a grown to 3")
    # never shrinks: a lower target leaves the members alone, and a deleted member comes back
    assert a0.put("/api/policies/%2F/cmr-target", {**policy, "definition": {
        "target-group-size": 1}})[0] == 204
    victim = c.names[2]
    assert a0.delete(f"/api/queues/%2F/cmr-b/members/{victim}")[0] == 204
    assert victim not in members("cmr-b", a0)  # the deleting node has applied the change
    wait_for(lambda: members("cmr-b") == sorted(c.names), timeout=30, what="cmr-b regrown")
    assert members("cmr-a") == sorted(c.names)
