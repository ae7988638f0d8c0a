"""Table tests of the operator's pure planner and spec parsing."""
from __future__ import annotations

import pytest
from quorumq_operator import planner as p
from quorumq_operator.spec import InvalidSpec, policy_desired, queue_desired


def qq(spec: dict | None = None, name: str = "orders", annotations: dict | None = None) -> dict:
    return {"apiVersion": "quorumq.dev/v1alpha1", "kind": "QuorumQueue",
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations or {}},
            "spec": {"broker": {"statefulSet": "qq"}, **(spec or {})}}


def node(name: str, running: bool = True, ordinal: int | None = None, ready: bool | None = True,
         gone: bool = False, members: int = 0) -> p.NodeObs:
    return p.NodeObs(name, running, ordinal, ready, gone, members)


N3 = (node("a", members=1), node("b", members=1), node("c", members=1))
ARGS = {"x-queue-type": "quorum"}


def obs(members: tuple[str, ...], nodes: tuple[p.NodeObs, ...] = N3, messages: int | None = 0,
        args: dict | None = None, qtype: str = "quorum") -> p.QueueObserved:
    return p.QueueObserved(p.QueueObs("/", "orders", qtype, members, members, members[0]
                                      if members else None, args or ARGS, messages), nodes)


# ---------------------------------------------------------------- spec parsing
def test_spec_defaults_name_vhost_target_and_queue_type() -> None:
    d = queue_desired(qq())
    assert (d.name, d.vhost, d.target_size, d.deletion_policy) == ("orders", "/", 3, "delete")
    assert d.arguments == {"x-queue-type": "quorum"}


def test_spec_maps_typed_arguments_to_x_arguments() -> None:
    d = queue_desired(qq({"name": "o.v1", "vhost": "prod", "arguments": {
        "deliveryLimit": 5, "maxLength": 10, "overflow": "reject-publish",
        "singleActiveConsumer": True, "targetGroupSize": 5, "leaderLocator": "balanced"}}))
    assert d.name == "o.v1" and d.vhost == "prod" and d.target_size == 5
    assert d.arguments == {"x-queue-type": "quorum", "x-delivery-limit": 5, "x-max-length": 10,
                           "x-overflow": "reject-publish", "x-single-active-consumer": True,
                           "x-quorum-target-group-size": 5, "x-queue-leader-locator": "balanced"}


@pytest.mark.parametrize("spec, text", [
    ({"arguments": {"maxLength": "10"}}, "maxLength must be int"),
    ({"arguments": {"maxLength": True}}, "maxLength must be int"),
    ({"arguments": {"overflow": "reject-publish-dlx"}}, "classic queues only"),
    ({"arguments": {"bogus": 1}}, "not a known argument"),
    ({"arguments": {"deadLetterRoutingKey": "k"}}, "needs deadLetterExchange"),
    ({"arguments": {"expires": 0}}, "at least 1"),
    ({"name": "amq.x"}, "reserved"),
    ({"deletionPolicy": "keep"}, "deletionPolicy"),
    ({"broker": {}}, "needs statefulSet"),
    ({"broker": {"service": "s", "host": "h"}}, "not both"),
])
def test_invalid_queue_specs_say_why(spec: dict, text: str) -> None:
    with pytest.raises(InvalidSpec, match=text):
        queue_desired(qq(spec))


def test_force_delete_annotation() -> None:
    assert queue_desired(qq(annotations={"quorumq.dev/force-delete": "true"})).force_delete
    assert not queue_desired(qq(annotations={"quorumq.dev/force-delete": "no"})).force_delete


@pytest.mark.parametrize("spec, text", [
    ({"pattern": "x", "definition": {"nope": 1}}, "not a known policy key"),
    ({"pattern": "x", "definition": {}}, "at least one key"),
    ({"pattern": "x", "definition": {"overflow": "x"}}, "must be one of"),
    ({"pattern": "x", "operatorPolicy": True, "definition": {"dead-letter-exchange": "d"}},
     "operator policies cannot set dead-letter-exchange"),
    ({"definition": {"max-length": 1}}, "pattern is required"),
])
def test_invalid_policy_specs_say_why(spec: dict, text: str) -> None:
    body = {"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"broker": {"statefulSet": "qq"}, **spec}}
    with pytest.raises(InvalidSpec, match=text):
        policy_desired(body)


# ---------------------------------------------------------------- plan_queue
DESIRED = queue_desired(qq())


@pytest.mark.parametrize("observed, expected", [
    # missing (never declared, or deleted inside the broker): declare
    (p.QueueObserved(None, N3), [p.DeclareQueue("/", "orders", ARGS)]),
    # at target: nothing
    (obs(("a", "b", "c")), []),
    # below target: grow onto the missing node
    (obs(("a", "b")), [p.AddMember("/", "orders", "c")]),
    # below target, two candidates: the least loaded first, then by name
    (obs(("a",), (node("a", members=9), node("b", members=5), node("c", members=2),
                  node("d", members=2))),
     [p.AddMember("/", "orders", "c"), p.AddMember("/", "orders", "d")]),
    # target capped by the nodes that exist
    (obs(("a",), (node("a"), node("b"))), [p.AddMember("/", "orders", "b")]),
    # a node that is down, or whose pod is not Ready, gets no member
    (obs(("a", "b"), (node("a"), node("b"), node("c", running=False))), []),
    (obs(("a", "b"), (node("a"), node("b"), node("c", ready=False))), []),
    # a member on a node gone for good: replace it first, then remove it
    (obs(("a", "b", "c"), (node("a"), node("b"), node("c", running=False, gone=True),
                           node("d"))),
     [p.AddMember("/", "orders", "d"), p.DeleteMember("/", "orders", "c")]),
    # gone and nowhere to go: remove it (membership shrinks to what exists)
    (obs(("a", "b", "c"), (node("a"), node("b"), node("c", running=False, gone=True))),
     [p.DeleteMember("/", "orders", "c")]),
    # above target: left alone (the operator never shrinks live members)
    (obs(("a", "b", "c", "d"), N3 + (node("d"),)), []),
])
def test_plan_queue(observed: p.QueueObserved, expected: list[p.Action]) -> None:
    assert p.plan_queue(DESIRED, observed) == expected


def test_plan_queue_all_members_gone_is_refused_not_deleted() -> None:
    nodes = (node("a", running=False, gone=True), node("b"))
    actions = p.plan_queue(DESIRED, obs(("a",), nodes))
    assert actions[0] == p.AddMember("/", "orders", "b")
    assert p.DeleteMember("/", "orders", "a") in actions  # a new member exists to keep


def test_plan_queue_only_gone_members_and_no_room_refuses() -> None:
    nodes = (node("a", running=False, gone=True),)
    [refusal] = p.plan_queue(DESIRED, obs(("a",), nodes))
    assert isinstance(refusal, p.Refuse) and refusal.reason == "AllMembersGone"


def test_plan_queue_reports_arguments_that_differ_and_keeps_membership() -> None:
    actions = p.plan_queue(DESIRED, obs(("a", "b"), args={**ARGS, "x-max-length": 5}))
    assert isinstance(actions[0], p.Refuse) and actions[0].reason == "ArgumentsDiffer"
    assert actions[1:] == [p.AddMember("/", "orders", "c")]


def test_plan_queue_refuses_a_classic_queue_of_the_same_name() -> None:
    [a] = p.plan_queue(DESIRED, obs(("a",), qtype="classic"))
    assert isinstance(a, p.Refuse) and a.reason == "NotAQuorumQueue"


# ---------------------------------------------------------------- deletion
@pytest.mark.parametrize("spec, annotations, messages, expected", [
    ({}, {}, 0, [p.DeleteQueue("/", "orders", if_empty=True)]),
    ({}, {}, None, [p.DeleteQueue("/", "orders", if_empty=True)]),  # broker checks if-empty
    ({"deletionPolicy": "retain"}, {}, 0, []),
    ({"deletionPolicy": "retain"}, {}, 7, []),
    ({}, {"quorumq.dev/force-delete": "true"}, 7, [p.DeleteQueue("/", "orders", if_empty=False)]),
])
def test_plan_queue_delete(spec: dict, annotations: dict, messages: int | None,
                           expected: list[p.Action]) -> None:
    d = queue_desired(qq(spec, annotations=annotations))
    assert p.plan_queue_delete(d, obs(("a",), messages=messages).queue) == expected


def test_plan_queue_delete_refuses_a_queue_with_messages() -> None:
    [a] = p.plan_queue_delete(DESIRED, obs(("a",), messages=7).queue)
    assert isinstance(a, p.Refuse) and a.reason == "QueueNotEmpty" and "7 messages" in a.message
    assert "quorumq.dev/force-delete" in a.message


def test_plan_queue_delete_of_a_missing_queue_is_nothing() -> None:
    assert p.plan_queue_delete(DESIRED, None) == []


# ---------------------------------------------------------------- policies
POL = policy_desired({"metadata": {"name": "lim", "namespace": "ns"}, "spec": {
    "broker": {"statefulSet": "qq"}, "pattern": "^o", "applyTo": "quorum_queues",
    "priority": 3, "definition": {"max-length": 10}}})
BODY = {"pattern": "^o", "definition": {"max-length": 10}, "priority": 3,
        "apply-to": "quorum_queues"}


@pytest.mark.parametrize("current, expected", [
    (None, [p.PutPolicy("/", "lim", False, BODY)]),
    ({**BODY, "vhost": "/", "name": "lim"}, []),
    ({**BODY, "definition": {"max-length": 11}}, [p.PutPolicy("/", "lim", False, BODY)]),
    ({**BODY, "priority": 0}, [p.PutPolicy("/", "lim", False, BODY)]),
])
def test_plan_policy(current: dict | None, expected: list[p.Action]) -> None:
    assert p.plan_policy(POL, current) == expected


def test_plan_policy_delete_and_matched_queues() -> None:
    assert p.plan_policy_delete(POL, True) == [p.DeletePolicy("/", "lim", False)]
    assert p.plan_policy_delete(POL, False) == []
    queues = [p.QueueObs("/", "o1", policy="lim"), p.QueueObs("/", "o2", policy="other"),
              p.QueueObs("v2", "o3", policy="lim"), p.QueueObs("/", "o0", policy="lim")]
    assert p.matched_queues(POL, queues) == ["o0", "o1"]


# ---------------------------------------------------------------- the StatefulSet
def q(name: str, members: tuple[str, ...], leader: str, target: int | None = None) -> p.QueueObs:
    return p.QueueObs("/", name, "quorum", members, members, leader, target=target)


def cluster(queues: tuple[p.QueueObs, ...], nodes: tuple[p.NodeObs, ...] = N3, replicas: int = 3,
            ready: int = 3, now: float = 100.0, disruption: float | None = 50.0,
            settled: float | None = None) -> p.ClusterObserved:
    return p.ClusterObserved(nodes, queues, replicas, ready, now, disruption, settled, 30.0, 3)


ABC = ("a", "b", "c")
ALL_ON_A = tuple(q(f"q{i}", ABC, "a") for i in range(6))
BALANCED = tuple(q(f"q{i}", ABC, "abc"[i % 3]) for i in range(6))


@pytest.mark.parametrize("obs_, actions, settled", [
    # a disruption quiet for longer than the debounce, leaders uneven: rebalance
    (cluster(ALL_ON_A), [p.Rebalance()], True),
    # already balanced: settle without acting
    (cluster(BALANCED), [], True),
    # within the debounce: wait
    (cluster(ALL_ON_A, now=70.0), [], False),
    # a pod not Ready yet: wait
    (cluster(ALL_ON_A, ready=2), [], False),
    # a node of the StatefulSet down: wait
    (cluster(ALL_ON_A, nodes=(node("a"), node("b"), node("c", running=False))), [], False),
    # no disruption since the last settle: nothing
    (cluster(ALL_ON_A, settled=60.0), [], False),
    (cluster(ALL_ON_A, disruption=None), [], False),
    # a disruption after the last settle: act again
    (cluster(ALL_ON_A, disruption=60.0, settled=55.0), [p.Rebalance()], True),
])
def test_plan_cluster_rebalance_is_debounced(obs_: p.ClusterObserved, actions: list[p.Action],
                                             settled: bool) -> None:
    plan = p.plan_cluster(obs_)
    assert (plan.actions, plan.settled) == (actions, settled)


def test_plan_cluster_scale_up_grows_queues_below_target_onto_the_new_pod() -> None:
    nodes = N3 + (node("d", ordinal=3),)
    queues = (q("small", ("a", "b"), "a"), q("full", ABC, "b"), q("big", ABC, "c", target=4))
    plan = p.plan_cluster(cluster(queues, nodes, replicas=4, ready=4))
    # "small" is below the default target (3): its new member goes to the least loaded
    # node, the new (empty) pod d; "big" asks for 4: it grows onto d; "full" is at target.
    assert plan.actions == [p.AddMember("/", "small", "d"), p.AddMember("/", "big", "d")]
    assert plan.settled  # quiet for longer than the debounce, and leaders a/b/c are even


def test_plan_cluster_scale_down_shrinks_nodes_gone_for_good() -> None:
    nodes = N3 + (node("d", running=False, ordinal=3, ready=False, gone=True),)
    queues = (q("x", ("a", "b", "d"), "a"), q("y", ABC, "b"))
    plan = p.plan_cluster(cluster(queues, nodes, disruption=None))
    assert plan.actions == [p.ShrinkNode("d"), p.AddMember("/", "x", "c")]


def test_plan_cluster_a_queue_below_target_does_not_starve_the_rebalance() -> None:
    stuck = q("stuck", ("a",), "a", target=3)  # its adds may fail every pass
    nodes = (node("a"), node("b"), node("c"))
    plan = p.plan_cluster(cluster(ALL_ON_A + (stuck,), nodes))
    assert plan.actions[-1] == p.Rebalance() and plan.settled
    assert p.AddMember("/", "stuck", "b") in plan.actions


def test_leaders_balanced_bound() -> None:
    assert p.leaders_balanced(BALANCED, N3)
    assert not p.leaders_balanced(ALL_ON_A, N3)
    # 4 queues on 3 nodes: 2/1/1 is balanced, 3/1/0 is not
    four = (q("1", ABC, "a"), q("2", ABC, "a"), q("3", ABC, "b"), q("4", ABC, "c"))
    assert p.leaders_balanced(four, N3)
    assert not p.leaders_balanced(four[:3] + (q("4", ABC, "a"),), N3)


# ---------------------------------------------------------------- status
def test_queue_status_ready_and_membership_conditions() -> None:
    st = p.queue_status(DESIRED, obs(("a", "b")), 4, "2026-01-01T00:00:00Z")
    ready, synced = st["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Declared")
    assert (synced["status"], synced["reason"]) == ("False", "BelowTarget")
    assert st["observedGeneration"] == 4 and st["members"] == ["a", "b"] and st["leader"] == "a"


def test_queue_status_no_quorum_and_transition_time_kept() -> None:
    o = p.QueueObserved(p.QueueObs("/", "orders", "quorum", ABC, ("a",), None, ARGS), N3)
    first = p.queue_status(DESIRED, o, 1, "T1")
    assert first["conditions"][0]["reason"] == "NoQuorum"
    again = p.queue_status(DESIRED, o, 1, "T2", first["conditions"])
    assert again["conditions"][0]["lastTransitionTime"] == "T1"  # no flip: time kept
    healed = p.queue_status(DESIRED, obs(ABC), 1, "T3", again["conditions"])
    assert healed["conditions"][0]["lastTransitionTime"] == "T3"


def test_queue_status_of_a_refusal() -> None:
    st = p.queue_status(DESIRED, obs(("a",)), 1, "T", problem=p.Refuse("ArgumentsDiffer", "m"))
    assert st["conditions"][0]["status"] == "False"
    assert st["conditions"][0]["reason"] == "ArgumentsDiffer"
