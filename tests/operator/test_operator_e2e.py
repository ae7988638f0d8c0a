"""The operator end to end: kopf (KopfRunner) against the stand-in Kubernetes API
(kmock), and behind it a real 3-node broker cluster whose management API the
operator drives. Every custom resource written is schema-validated first, and
every status the operator writes is validated against the CRD's schema too.
"""
from __future__ import annotations

import math
import os
import random
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from kopf.testing import KopfRunner
from quorumq_operator.__main__ import kopf_args

from tests.e2e.broker_proc import free_port

from . import manifests as m
from .conftest import GROUP, NS, KubeApi, OpCluster, install_broker_statefulset, wait_for

SEED = 11
RNG = random.Random(SEED)


@pytest.fixture(scope="module")
def operator(kube: KubeApi, brokers: OpCluster) -> Iterator[dict[str, Any]]:
    """The broker StatefulSet's objects in the API, then the operator running
    (its real entry point's kopf arguments, plus a login handler for kmock)."""
    sts = install_broker_statefulset(kube, brokers, {"quorumq.dev/rebalance-debounce-seconds": "1"})
    metrics_port = free_port()
    env = {"QQ_OPERATOR_NAMESPACES": NS, "QQ_OPERATOR_PEERING": "standalone",
           "QQ_OPERATOR_LIVENESS_PORT": "0", "QQ_OPERATOR_METRICS_PORT": str(metrics_port),
           "QQ_OPERATOR_VERBOSE": "1", "QQ_TEST_KUBE_URL": kube.url}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    args = kopf_args(env, ["-m", "tests.operator.kopf_login"])
    assert args[:3] == ["run", "-m", "quorumq_operator.handlers"] and "--standalone" in args
    try:
        with KopfRunner(args, timeout=60) as runner:
            yield {"sts": sts, "runner": runner, "metrics_port": metrics_port,
                   "started": time.monotonic()}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert runner.exception is None, runner.output[-5000:]


def qq_obj(kube: KubeApi, name: str) -> dict[str, Any] | None:
    return kube.get(GROUP, "quorumqueues", name)


def condition(obj: dict[str, Any] | None, ctype: str = "Ready") -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return dict(c)
    return {}


def wait_ready(kube: KubeApi, name: str, plural: str = "quorumqueues", timeout: float = 30,
               status: str = "True") -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = kube.get(GROUP, plural, name)
        return obj if condition(obj).get("status") == status else None
    obj = wait_for(check, timeout, f"{plural}/{name} Ready={status}")
    m.validate_status(obj)  # what the operator wrote fits the CRD's status schema
    return obj


def publish(brokers: OpCluster, queue: str, count: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", brokers.nodes[1].port))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()


# ---------------------------------------------------------------- QuorumQueue
def test_quorum_queue_declared_with_arguments_and_status(kube: KubeApi, brokers: OpCluster,
                                                         operator: dict[str, Any]) -> None:
    kube.create(m.quorum_queue("orders", NS, {"arguments": {
        "deliveryLimit": 5, "maxLength": 1000, "overflow": "reject-publish",
        "leaderLocator": "balanced"}}))
    obj = wait_ready(kube, "orders")
    # the brokers' real state: every node knows the queue, with the asked arguments
    for api in brokers.apis:
        view = wait_for(lambda api=api: api.queue("orders"), 10, "queue on every node")
        assert view["type"] == "quorum"
        assert view["arguments"] == {"x-queue-type": "quorum", "x-delivery-limit": 5,
                                     "x-max-length": 1000, "x-overflow": "reject-publish",
                                     "x-queue-leader-locator": "balanced"}
    view = brokers.apis[0].queue("orders")
    st = obj["status"]
    assert sorted(st["members"]) == sorted(brokers.names) == sorted(view["members"])
    assert st["leader"] in brokers.names
    assert st["observedGeneration"] == 1
    assert condition(obj, "MembershipSynced")["status"] == "True"
    reasons = {e["reason"] for e in kube.events("orders")}
    assert "DeclareQueue" in reasons
    # counts flow into status
    publish(brokers, "orders", 3)
    wait_for(lambda: (qq_obj(kube, "orders") or {}).get("status", {}).get("messagesReady") == 3,
             15, "messagesReady == 3 in status")


def test_queue_deleted_inside_the_broker_is_recreated(kube: KubeApi, brokers: OpCluster,
                                                      operator: dict[str, Any]) -> None:
    kube.create(m.quorum_queue("drifty", NS))
    wait_ready(kube, "drifty")
    api = brokers.apis[RNG.randrange(3)]
    status, _ = api.call("DELETE", "/api/queues/%2F/drifty")
    assert status == 204
    assert api.queue("drifty") is None
    # the drift timer (1 s in tests) declares it again
    view = wait_for(lambda: api.queue("drifty"), 20, "queue recreated by the operator")
    assert view["type"] == "quorum"
    wait_ready(kube, "drifty")


def test_membership_grows_to_the_target_size(kube: KubeApi, brokers: OpCluster,
                                             operator: dict[str, Any]) -> None:
    kube.create(m.quorum_queue("grow-me", NS, {"arguments": {"initialGroupSize": 1,
                                                             "targetGroupSize": 3}}))

    def three_members() -> bool:
        view = brokers.apis[0].queue("grow-me")
        return view is not None and len(view["members"]) == 3
    wait_for(three_members, 60, "membership grown to 3")
    obj = wait_for(lambda: (o := qq_obj(kube, "grow-me")) and
                   len(o.get("status", {}).get("members", [])) == 3 and o, 20, "status members")
    assert condition(obj, "MembershipSynced")["status"] == "True"
    # grown by the operator (the brokers' own membership reconciliation is off): by the
    # QuorumQueue's handler or by the StatefulSet's timer, whichever ticked first
    assert any(e["reason"] == "AddMember" and "'grow-me'" in e["message"] for e in kube.events())


def test_delete_refused_while_queue_holds_messages_until_forced(
        kube: KubeApi, brokers: OpCluster, operator: dict[str, Any]) -> None:
    kube.create(m.quorum_queue("precious", NS))
    wait_ready(kube, "precious")
    publish(brokers, "precious", 2)
    kube.delete(GROUP, "quorumqueues", "precious")
    obj = wait_ready(kube, "precious", status="False")
    assert condition(obj)["reason"] == "QueueNotEmpty"
    assert "force-delete" in condition(obj)["message"]
    assert any(e["reason"] == "QueueNotEmpty" and e["type"] == "Warning"
               for e in kube.events("precious"))
    assert brokers.apis[2].queue("precious") is not None  # still there, messages intact
    assert qq_obj(kube, "precious") is not None  # finalizer holds the resource
    kube.patch(GROUP, "quorumqueues", "precious",
               {"metadata": {"annotations": {"quorumq.dev/force-delete": "true"}}})
    wait_for(lambda: qq_obj(kube, "precious") is None, 30, "resource released")
    assert brokers.apis[0].queue("precious") is None


def test_empty_queue_is_deleted_and_retain_keeps_it(kube: KubeApi, brokers: OpCluster,
                                                    operator: dict[str, Any]) -> None:
    kube.create(m.quorum_queue("temp", NS))
    kube.create(m.quorum_queue("kept", NS, {"name": "kept.v1", "deletionPolicy": "retain"}))
    wait_ready(kube, "temp")
    wait_ready(kube, "kept")
    assert brokers.apis[1].queue("kept.v1") is not None  # spec.name wins over metadata.name
    kube.delete(GROUP, "quorumqueues", "temp")
    kube.delete(GROUP, "quorumqueues", "kept")
    wait_for(lambda: qq_obj(kube, "temp") is None and qq_obj(kube, "kept") is None, 30,
             "both resources gone")
    assert brokers.apis[0].queue("temp") is None
    assert brokers.apis[0].queue("kept.v1") is not None


def test_invalid_spec_is_a_permanent_condition_not_a_crash(
        kube: KubeApi, brokers: OpCluster, operator: dict[str, Any]) -> None:
    # The CRD schema refuses this (a real API server would never store it) ...
    bad = {"apiVersion": GROUP, "kind": "QuorumQueue",
           "metadata": {"name": "bad", "namespace": NS},
           "spec": {"broker": {"statefulSet": "qq"},
                    "arguments": {"overflow": "reject-publish-dlx"}}}
    with pytest.raises(m.jsonschema.ValidationError):
        m.validate_cr(bad)
    # ... but kmock stores it: the operator must say so, not crash or retry for ever.
    kube.create(bad)
    obj = wait_ready(kube, "bad", status="False")
    assert condition(obj)["reason"] == "InvalidSpec"
    assert "classic queues only" in condition(obj)["message"]
    assert brokers.apis[0].queue("bad") is None
    kube.delete(GROUP, "quorumqueues", "bad")
    wait_for(lambda: qq_obj(kube, "bad") is None, 20, "invalid resource deleted")


def test_unreachable_broker_is_ready_false_and_retried(kube: KubeApi, brokers: OpCluster,
                                                       operator: dict[str, Any]) -> None:
    dead_port = free_port()
    kube.create(m.quorum_queue("nowhere", NS, {"broker": {
        "host": "127.0.0.1", "port": dead_port, "secretName": "qq-creds"}}))
    obj = wait_ready(kube, "nowhere", status="False")
    assert condition(obj)["reason"] == "BrokerUnreachable"
    assert str(dead_port) in condition(obj)["message"]
    # pointing it at a live broker heals it (spec change -> update handler)
    kube.patch(GROUP, "quorumqueues", "nowhere",
               {"spec": {"broker": {"port": brokers.nodes[2].management_port}}})
    wait_ready(kube, "nowhere")
    assert brokers.apis[2].queue("nowhere") is not None


# ---------------------------------------------------------------- Policy
def test_policy_apply_update_matched_queues_and_delete(kube: KubeApi, brokers: OpCluster,
                                                       operator: dict[str, Any]) -> None:
    kube.create(m.quorum_queue("pol-a", NS))
    kube.create(m.quorum_queue("pol-b", NS))
    wait_ready(kube, "pol-a")
    wait_ready(kube, "pol-b")
    kube.create(m.policy("pol-limits", NS, {"pattern": "^pol-", "applyTo": "quorum_queues",
                                            "priority": 5, "definition": {"max-length": 10}}))
    obj = wait_for(lambda: (o := kube.get(GROUP, "policies", "pol-limits")) and
                   o.get("status", {}).get("matchedQueueCount") == 2 and o, 30, "policy applied")
    m.validate_cr(obj)
    assert obj["status"]["matchedQueues"] == ["pol-a", "pol-b"]
    _, pol = brokers.apis[1].call("GET", "/api/policies/%2F/pol-limits")
    assert pol["definition"] == {"max-length": 10} and pol["apply-to"] == "quorum_queues"
    assert brokers.apis[2].queue("pol-a")["effective_policy_definition"]["max-length"] == 10
    # update the definition: the broker follows
    kube.patch(GROUP, "policies", "pol-limits", {"spec": {"definition": {"max-length": 20}}})
    wait_for(lambda: brokers.apis[0].call("GET", "/api/policies/%2F/pol-limits")[1]
             ["definition"] == {"max-length": 20}, 20, "policy updated")
    # drift: a policy removed inside the broker comes back
    brokers.apis[0].call("DELETE", "/api/policies/%2F/pol-limits")
    wait_for(lambda: brokers.apis[0].call("GET", "/api/policies/%2F/pol-limits")[0] == 200, 20,
             "policy restored")
    # an operator policy goes to /api/operator-policies
    kube.create(m.policy("caps", NS, {"pattern": "^pol-a$", "applyTo": "queues",
                                      "operatorPolicy": True,
                                      "definition": {"delivery-limit": 7}}))
    obj = wait_for(lambda: (o := kube.get(GROUP, "policies", "caps")) and
                   o.get("status", {}).get("matchedQueues") == ["pol-a"] and o, 30, "op policy")
    assert brokers.apis[0].call("GET", "/api/operator-policies/%2F/caps")[0] == 200
    assert brokers.apis[0].call("GET", "/api/policies/%2F/caps")[0] == 404
    # delete both: gone from the broker
    kube.delete(GROUP, "policies", "pol-limits")
    kube.delete(GROUP, "policies", "caps")
    wait_for(lambda: brokers.apis[0].call("GET", "/api/policies/%2F/pol-limits")[0] == 404
             and brokers.apis[0].call("GET", "/api/operator-policies/%2F/caps")[0] == 404,
             30, "policies deleted")


# ---------------------------------------------------------------- the StatefulSet
def leaders(brokers: OpCluster, prefix: str = "") -> dict[str, int]:
    _, views = brokers.apis[0].call("GET", "/api/queues/%2F")
    counts = {n: 0 for n in brokers.names}
    for v in views:
        if v["name"].startswith(prefix) and v.get("leader") in counts:
            counts[v["leader"]] += 1
    return counts


def test_leaders_rebalanced_after_a_pod_restart(kube: KubeApi, brokers: OpCluster,
                                                operator: dict[str, Any]) -> None:
    # the operator's own start counts as a disruption: let it settle (debounce 1 s) first
    wait_for(lambda: time.monotonic() - operator["started"] > 3, 10, "start-up settled")
    api0 = brokers.apis[0]
    total = 9
    for i in range(total):  # client-local on node 0: every leader there
        status, _ = api0.call("PUT", f"/api/queues/%2F/rb{i}", {
            "durable": True, "arguments": {"x-queue-type": "quorum",
                                           "x-queue-leader-locator": "client-local"}})
        assert status in (201, 204)
    wait_for(lambda: leaders(brokers, "rb")[brokers.names[0]] == total, 20, "leaders on node 0")
    # No disruption, no rebalance (debounce is 1 s, the timer ticks every 1 s).
    time.sleep(2.5)  # deliberately: proving that nothing happens takes waiting
    assert leaders(brokers, "rb")[brokers.names[0]] == total
    # Restart pod qq-2: its broker node stops, the pod turns unready, then comes back as a
    # new pod (new uid) once the node is up again.
    node = brokers.nodes[2]
    node.stop()
    kube.patch("v1", "pods", "qq-2", {"status": m.pod_status(False)})
    node.start(timeout=120)
    kube.delete("v1", "pods", "qq-2")
    kube.create(m.pod(operator["sts"], 2, ready=True))
    # Leaders are rebalanced over every queue of the cluster (the bound: no node
    # leads more than ceil(queues / nodes) + 1); before, node 0 led all `total` rb* queues.
    rebalances_before = sum(e["reason"] == "Rebalance" for e in kube.events("qq"))
    all_queues = sum(leaders(brokers).values())
    bound = math.ceil(all_queues / 3) + 1
    assert total > bound  # the starting point breaks the bound: the test can fail
    try:
        counts = wait_for(lambda: (c := leaders(brokers)) and max(c.values()) <= bound
                          and c, 60, "leaders rebalanced")
    except AssertionError:
        raise AssertionError(f"leaders {leaders(brokers)}, events on the StatefulSet: "
                             f"{[(e['reason'], e['message']) for e in kube.events('qq')]}"
                             ) from None
    assert sum(counts.values()) == all_queues
    # the operator did it (and said so: Events are posted asynchronously, so wait for it)
    wait_for(lambda: sum(e["reason"] == "Rebalance" for e in kube.events("qq"))
             > rebalances_before, 10, "a Rebalance Event on the StatefulSet")


def test_operator_metrics(operator: dict[str, Any]) -> None:
    port = operator["metrics_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 'quorumq_operator_reconciles_total{kind="QuorumQueue",result="ok"}' in text
    assert 'quorumq_operator_actions_total{action="DeclareQueue",result="changed"}' in text
    assert "quorumq_operator_broker_unreachable_total" in text



def test_every_request_kopf_made_is_allowed_by_the_charts_role(kube: KubeApi,
                                                               operator: dict[str, Any]) -> None:
    """Runs last in this module: by now the operator has declared, recreated,
    grown, deleted (finalizers), applied policies, rebalanced and posted
    Events. A real API server would have refused any request the chart's
    operator Role does not allow (kmock enforces no RBAC)."""
    from tests.k8s.helm import by_kind, render

    from .rbac import denied

    roles = [r for r in by_kind(render(namespace=NS), "Role") if r["metadata"]["name"].endswith("-operator")]
    requests = kube.kopf_requests()
    assert ("patch", "apps", "statefulsets", NS) in requests  # the timer's finalizer
    assert denied(requests, roles) == []
