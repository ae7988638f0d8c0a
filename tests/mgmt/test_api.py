"""Management API against a real 3-node cluster: reads, declarations, policies,
authentication and tags, bad requests, health checks, metrics values."""
from __future__ import annotations

import json
import re
import urllib.request

import pika
import pytest

from broker.mgmt.api import ROUTES
from broker.mgmt.openapi import openapi_document

from .conftest import ROOT_DIR, Api, MgmtCluster, metric, metrics_text, wait_for

QQ = {"durable": True, "arguments": {"x-queue-type": "quorum"}}


def publish(c: MgmtCluster, node: int, queue: str, n: int, vhost: str = "/") -> None:
    params = pika.ConnectionParameters("127.0.0.1", c.nodes[node].port, virtual_host=vhost,
                                       credentials=pika.PlainCredentials("guest", "guest"))
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", queue, f"m{i}".encode())
    finally:
        conn.close()


def counts(api: Api, queue: str, vhost: str = "%2F") -> tuple[int, int, int]:
    status, body = api.get(f"/api/queues/{vhost}/{queue}")
    assert status == 200, body
    return body["messages"], body["messages_ready"], body["messages_unacknowledged"]


# ---------------------------------------------------------------- authentication
def test_authentication_and_tags(defs_cluster: MgmtCluster) -> None:
    api = defs_cluster.apis[0]
    status, body = api.get("/api/overview", auth=False)
    assert status == 401 and body["error"] == "not_authorized" and body["reason"]
    req = urllib.request.Request(api.base + "/api/overview")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("expected 401")
    except urllib.error.HTTPError as exc:
        assert exc.headers["WWW-Authenticate"].startswith("Basic")
    assert api.as_user("guest", "wrong").get("/api/overview")[0] == 401
    assert api.as_user("nobody", "pw").get("/api/overview")[0] == 401
    status, body = api.as_user("plain", "pw").get("/api/overview")
    assert status == 403 and "management tag" in body["reason"]
    for user in ("monitor", "mgr", "pm"):
        assert api.as_user(user, "pw").get("/api/overview")[0] == 200, user
    # probes and the OpenAPI document need no credentials
    assert api.get("/api/health/live", auth=False) == (200, {"status": "ok"})
    assert api.get("/api/health/ready", auth=False) == (200, {"status": "ok"})
    status, doc = api.get("/api/openapi.json", auth=False)
    assert status == 200 and doc["openapi"].startswith("3.")
    status, body = api.get("/api/no-such-thing", auth=False)
    assert status == 404 and body["error"] == "not_found"
    status, body = api.call("PATCH", "/api/overview")
    assert status == 405 and body["reason"]


def test_vhost_visibility_by_tag(defs_cluster: MgmtCluster) -> None:
    api = defs_cluster.apis[1]
    names = lambda a: sorted(v["name"] for v in a.get("/api/vhosts")[1])  # noqa: E731
    assert names(api) == ["/", "other"]
    assert names(api.as_user("monitor", "pw")) == ["/", "other"]
    assert names(api.as_user("mgr", "pw")) == ["/"]
    assert api.as_user("mgr", "pw").get("/api/vhosts/other")[0] == 403
    assert api.get("/api/vhosts/nope")[0] == 404
    assert api.as_user("mgr", "pw").get("/api/users")[0] == 403
    assert api.as_user("monitor", "pw").get("/api/permissions")[0] == 403
    status, users = api.get("/api/users")
    assert status == 200
    assert {u["name"]: u["tags"] for u in users}["monitor"] == ["monitoring"]
    status, perms = api.get("/api/permissions")
    assert {"user": "mgr", "vhost": "/", "configure": "^mgr-", "write": ".*", "read": ".*"} in perms
    assert api.as_user("mgr", "pw").get("/api/exchanges/other")[0] == 403


def test_write_permissions(defs_cluster: MgmtCluster) -> None:
    api = defs_cluster.apis[0]
    mgr, pm, mon = (api.as_user(u, "pw") for u in ("mgr", "pm", "monitor"))
    assert mgr.put("/api/queues/%2F/mgr-q", QQ)[0] == 201
    status, body = mgr.put("/api/queues/%2F/not-mine", QQ)
    assert status == 403 and "refused for user 'mgr'" in body["reason"]
    assert mgr.put("/api/queues/other/mgr-q", QQ)[0] == 403
    assert mon.put("/api/queues/%2F/mon-q", QQ)[0] == 403
    assert api.get("/api/queues/%2F/not-mine")[0] == 404  # nothing was declared
    policy = {"pattern": "^nothing$", "definition": {"max-length": 1}}
    assert mgr.put("/api/policies/%2F/p-mgr", policy)[0] == 403
    assert pm.put("/api/policies/%2F/p-pm", policy)[0] == 201
    assert pm.put("/api/operator-policies/%2F/op-pm", policy)[0] == 403
    assert pm.delete("/api/policies/%2F/p-pm")[0] == 204
    assert mgr.delete("/api/queues/%2F/mgr-q")[0] == 204


# ---------------------------------------------------------------- cluster reads
def test_overview_and_nodes(defs_cluster: MgmtCluster) -> None:
    names = set(defs_cluster.names)
    for i, api in enumerate(defs_cluster.apis):
        status, ov = api.get("/api/overview")
        assert status == 200
        assert ov["node"] == defs_cluster.names[i]
        assert ov["listeners"][0]["port"] == defs_cluster.nodes[i].port
        status, nodes = api.get("/api/nodes")
        assert {n["name"] for n in nodes} == names
        assert all(n["running"] for n in nodes)
        assert sum(n["metadata_leader"] for n in nodes) == 1
    name = defs_cluster.names[2]
    status, one = defs_cluster.apis[0].get(f"/api/nodes/{name}")
    assert status == 200 and one["name"] == name
    assert defs_cluster.apis[0].get("/api/nodes/rabbit@nowhere")[0] == 404


def test_exchanges_and_bindings(defs_cluster: MgmtCluster) -> None:
    api = defs_cluster.apis[0]
    status, xs = api.get("/api/exchanges/%2F")
    assert status == 200
    assert {"amq.direct", "amq.topic", ""} <= {x["name"] for x in xs}
    assert api.put("/api/queues/%2F/bound-q", QQ)[0] == 201
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", defs_cluster.nodes[1].port, credentials=pika.PlainCredentials("guest", "guest")))
    conn.channel().queue_bind("bound-q", "amq.topic", "a.#")
    conn.close()
    want = {"source": "amq.topic", "destination": "bound-q", "destination_type": "queue",
            "routing_key": "a.#"}

    def bound() -> bool:
        _, bs = defs_cluster.apis[2].get("/api/bindings/%2F")
        return any(all(b[k] == v for k, v in want.items()) for b in bs)
    wait_for(bound, what="the binding on node 3")
    assert defs_cluster.apis[2].get("/api/bindings/nope")[0] == 404


# ---------------------------------------------------------------- queues
def test_queue_lifecycle(defs_cluster: MgmtCluster) -> None:
    a0, a1, a2 = defs_cluster.apis
    assert a0.put("/api/queues/%2F/life", QQ) == (201, None)
    assert a1.put("/api/queues/%2F/life", QQ) == (204, None)  # exists: equivalent
    status, body = a0.put("/api/queues/%2F/life", {"durable": True, "arguments": {
        "x-queue-type": "quorum", "x-max-length": 5}})
    assert status == 400 and "x-max-length" in body["reason"]
    for api in (a0, a1, a2):
        status, q = api.get("/api/queues/%2F/life")
        assert status == 200
        assert q["type"] == "quorum" and q["durable"] and q["arguments"] == {"x-queue-type": "quorum"}
        assert sorted(q["members"]) == sorted(defs_cluster.names)
        assert sorted(q["online"]) == sorted(defs_cluster.names)
        assert q["leader"] in defs_cluster.names and q["node"] == q["leader"]
    publish(defs_cluster, 1, "life", 4)
    for api in (a0, a1, a2):
        wait_for(lambda api=api: counts(api, "life") == (4, 4, 0), what="4 ready messages")
    listed = {q["name"]: q for q in a2.get("/api/queues")[1]}
    assert listed["life"]["messages_ready"] == 4
    assert "life" in {q["name"] for q in a2.get("/api/queues/%2F")[1]}
    status, body = a0.delete("/api/queues/%2F/life?if-empty=true")
    assert status == 400 and "not empty" in body["reason"]
    assert a0.delete("/api/queues/%2F/life/contents") == (204, None)
    for api in (a0, a1, a2):
        wait_for(lambda api=api: counts(api, "life") == (0, 0, 0), what="an empty queue")
    assert a1.delete("/api/queues/%2F/life?if-empty=true&if-unused=true") == (204, None)
    for api in (a0, a1, a2):
        wait_for(lambda api=api: api.get("/api/queues/%2F/life")[0] == 404, what="queue gone")
    assert a0.delete("/api/queues/%2F/life")[0] == 404
    assert a0.delete("/api/queues/%2F/life/contents")[0] == 404


def test_delete_if_unused_refused_with_a_consumer(defs_cluster: MgmtCluster) -> None:
    api = defs_cluster.apis[0]
    assert api.put("/api/queues/%2F/busy", QQ)[0] == 201
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", defs_cluster.nodes[0].port, credentials=pika.PlainCredentials("guest", "guest")))
    ch = conn.channel()
    ch.basic_consume("busy", lambda *a: None)
    try:
        wait_for(lambda: api.get("/api/queues/%2F/busy")[1]["consumers"] == 1, what="a consumer")
        status, body = api.delete("/api/queues/%2F/busy?if-unused=true")
        assert status == 400 and "in use" in body["reason"]
    finally:
        conn.close()
    wait_for(lambda: api.get("/api/queues/%2F/busy")[1]["consumers"] == 0, what="no consumer")
    assert api.delete("/api/queues/%2F/busy?if-unused=true")[0] == 204


def test_counts_from_a_node_without_a_member(defs_cluster: MgmtCluster) -> None:
    a0, _, a2 = defs_cluster.apis
    body = {"arguments": {"x-queue-type": "quorum", "x-quorum-initial-group-size": 1}}
    assert a0.put("/api/queues/%2F/solo", body)[0] == 201
    q = wait_for(lambda: (r := a2.get("/api/queues/%2F/solo"))[0] == 200 and r[1],
                 what="the queue on node 3")
    assert q["members"] == [defs_cluster.names[0]]
    publish(defs_cluster, 0, "solo", 2)
    wait_for(lambda: counts(a2, "solo") == (2, 2, 0), what="counts via the leader")
    assert a2.get("/api/queues/%2F/solo")[1]["counts_known"] is True
    assert a2.delete("/api/queues/%2F/solo?if-empty=true")[0] == 400
    assert a2.delete("/api/queues/%2F/solo")[0] == 204


@pytest.mark.parametrize(("method", "path", "raw", "status", "reason"), [
    ("PUT", "/api/queues/%2F/bad", b"{not json", 400, "malformed JSON"),
    ("PUT", "/api/queues/%2F/bad", b"[1, 2]", 400, "must be a JSON object"),
    ("PUT", "/api/queues/%2F/bad", b'{"durable": "yes"}', 400, "'durable' must be bool"),
    ("PUT", "/api/queues/%2F/bad", b'{"colour": 1}', 400, "unknown key 'colour'"),
    ("PUT", "/api/queues/%2F/bad", b'{"type": "stream"}', 400, "unsupported queue type"),
    ("PUT", "/api/queues/%2F/bad", b'{"node": "rabbit@nowhere"}', 404, "no node"),
    ("PUT", "/api/queues/%2F/bad", b'{"arguments": {"x-queue-type": "quorum", '
                                   b'"x-max-length": -1}}', 400, "x-max-length"),
    ("PUT", "/api/queues/%2F/amq.bad", b"{}", 403, "reserved prefix"),
    ("PUT", "/api/queues/nope/bad", b"{}", 404, "no vhost 'nope'"),
    ("GET", "/api/queues/%2F/bad", None, 404, "no queue 'bad'"),
    ("DELETE", "/api/queues/%2F/bad?if-empty=maybe", None, 404, "no queue"),
    ("PUT", "/api/policies/%2F/p", b'{"definition": {"max-length": 1}}', 400,
     "'pattern' is required"),
    ("PUT", "/api/policies/%2F/p", b'{"pattern": "(", "definition": {"max-length": 1}}', 400,
     "invalid regular expression"),
    ("PUT", "/api/policies/%2F/p", b'{"pattern": ".*", "definition": {"max-length": -1}}', 400,
     "not a valid maximum length"),
    ("PUT", "/api/policies/%2F/p", b'{"pattern": ".*", "definition": {"colour": 1}}', 400,
     "not recognised policy settings"),
    ("PUT", "/api/policies/%2F/p", b'{"pattern": ".*", "definition": {"max-length": 1}, '
                                   b'"priority": "high"}', 400, "'priority' must be int"),
    ("PUT", "/api/operator-policies/%2F/p", b'{"pattern": ".*", "definition": '
                                            b'{"dead-letter-exchange": "x"}}', 400,
     "not recognised"),
    ("GET", "/api/policies/%2F/none", None, 404, "no policy 'none'"),
    ("DELETE", "/api/operator-policies/%2F/none", None, 404, "no operator policy"),
    ("POST", "/api/queues/%2F/bad/members", b'{"node": 3}', 404, "no queue"),
    ("POST", "/api/quorum-queues/grow", b'{"node": "rabbit@nowhere"}', 404, "no node"),
    ("POST", "/api/quorum-queues/grow", b'{}', 400, "'node' is required"),
    ("POST", "/api/quorum-queues/shrink", b'{"node": 1}', 400, "'node' must be str"),
    ("POST", "/api/quorum-queues/rebalance", b'{"queue_pattern": "["}', 400,
     "invalid regular expression"),
    ("POST", "/api/nodes/rabbit@nowhere/drain", None, 404, "no node"),
    ("GET", "/api/health/checks/node-is-quorum-critical?node=x", None, 404, "no node 'x'"),
])
def test_bad_requests_get_json_reasons(defs_cluster: MgmtCluster, method: str, path: str,
                                       raw: bytes | None, status: int, reason: str) -> None:
    got, body = defs_cluster.apis[1].call(method, path, raw=raw)
    assert got == status, body
    assert isinstance(body, dict) and reason in body["reason"], body
    assert body["error"]


def test_drain_refuses_desired_replicas_without_statefulset_discovery(defs_cluster: MgmtCluster) -> None:
    """`desired_replicas` (a scale-down's other leaving pods) needs the pods'
    ordinals; a node that cannot tell them refuses rather than drain onto them."""
    api = defs_cluster.apis[0]
    node = defs_cluster.names[2]
    for raw, reason in ((b'{"desired_replicas": 2}', "cluster.discovery = statefulset"),
                        (b'{"desired_replicas": -1}', "0 or more"),
                        (b'{"desired_replicas": "2"}', "'desired_replicas' must be int"),
                        (b'{"exclude": []}', "unknown key 'exclude'")):
        status, body = api.call("POST", f"/api/nodes/{node}/drain", raw=raw)
        assert status == 400 and reason in body["reason"], (raw, body)


def test_bad_boolean_query_flag(defs_cluster: MgmtCluster) -> None:
    api = defs_cluster.apis[0]
    assert api.put("/api/queues/%2F/flags", QQ)[0] == 201
    status, body = api.delete("/api/queues/%2F/flags?if-empty=maybe")
    assert status == 400 and "if-empty" in body["reason"]
    assert api.delete("/api/queues/%2F/flags")[0] == 204


# ---------------------------------------------------------------- policies
def test_policies_applied_live_and_shown_per_queue(defs_cluster: MgmtCluster) -> None:
    a0, a1, a2 = defs_cluster.apis
    assert a0.put("/api/queues/%2F/pol-q", QQ)[0] == 201
    publish(defs_cluster, 0, "pol-q", 10)
    wait_for(lambda: counts(a1, "pol-q")[0] == 10, what="10 messages")
    pol = {"pattern": "^pol-", "definition": {"max-length": 3}, "apply-to": "queues",
           "priority": 1}
    assert a1.put("/api/policies/%2F/p-len", pol) == (201, None)
    assert a1.put("/api/policies/%2F/p-len", pol) == (204, None)  # update
    status, got = a2.get("/api/policies/%2F/p-len")
    assert status == 200
    assert got == {"vhost": "/", "name": "p-len", "pattern": "^pol-", "apply-to": "queues",
                   "definition": {"max-length": 3}, "priority": 1}
    assert any(p["name"] == "p-len" for p in a0.get("/api/policies")[1])
    assert any(p["name"] == "p-len" for p in a0.get("/api/policies/%2F")[1])
    for api in (a0, a1, a2):
        wait_for(lambda api=api: api.get("/api/queues/%2F/pol-q")[1]["policy"] == "p-len",
                 what="the policy on every node")
    q = a2.get("/api/queues/%2F/pol-q")[1]
    assert q["effective_policy_definition"] == {"max-length": 3}
    # applied live: the next publish finds the queue over its new limit (drop-head)
    publish(defs_cluster, 2, "pol-q", 1)
    wait_for(lambda: counts(a0, "pol-q")[0] == 3, what="max-length 3 applied live")
    # the operator policy's lower limit wins
    op = {"pattern": "^pol-", "definition": {"max-length": 2}}
    assert a0.put("/api/operator-policies/%2F/op-len", op) == (201, None)
    wait_for(lambda: a1.get("/api/queues/%2F/pol-q")[1]["operator_policy"] == "op-len",
             what="the operator policy")
    assert a1.get("/api/queues/%2F/pol-q")[1]["effective_policy_definition"] == {"max-length": 2}
    assert a0.get("/api/operator-policies/%2F/op-len")[1]["apply-to"] == "queues"
    publish(defs_cluster, 1, "pol-q", 1)
    wait_for(lambda: counts(a2, "pol-q")[0] == 2, what="max-length 2 applied live")
    assert a0.delete("/api/operator-policies/%2F/op-len") == (204, None)
    assert a0.delete("/api/policies/%2F/p-len") == (204, None)
    wait_for(lambda: a2.get("/api/queues/%2F/pol-q")[1]["policy"] is None, what="policy cleared")
    assert a2.get("/api/queues/%2F/pol-q")[1]["effective_policy_definition"] == {}
    publish(defs_cluster, 0, "pol-q", 3)
    wait_for(lambda: counts(a0, "pol-q")[0] == 5, what="no limit any more")
    assert a0.get("/api/policies/%2F/p-len")[0] == 404
    assert a0.delete("/api/policies/%2F/p-len")[0] == 404
    assert a0.delete("/api/queues/%2F/pol-q")[0] == 204


# ---------------------------------------------------------------- health
def test_health_checks_all_up(defs_cluster: MgmtCluster) -> None:
    for api in defs_cluster.apis:
        assert api.get("/api/health/checks/alarms") == (200, {"status": "ok"})
        assert api.get("/api/health/checks/node-is-quorum-critical") == (200, {"status": "ok"})
    other = defs_cluster.names[2]
    assert defs_cluster.apis[0].get(
        f"/api/health/checks/node-is-quorum-critical?node={other}") == (200, {"status": "ok"})


# ---------------------------------------------------------------- metrics
def test_metrics_match_known_state(defs_cluster: MgmtCluster) -> None:
    a0 = defs_cluster.apis[0]
    assert a0.put("/api/queues/%2F/met-q", QQ)[0] == 201
    publish(defs_cluster, 0, "met-q", 5)
    leader = a0.get("/api/queues/%2F/met-q")[1]["leader"]
    li = defs_cluster.names.index(leader)
    lport = defs_cluster.nodes[li].metrics_port

    def ready() -> float | None:
        return metric(metrics_text(lport), "rabbitmq_queue_messages_ready", vhost="/", queue="met-q")
    wait_for(lambda: ready() == 5, what="5 ready in the leader's metrics")
    # followers do not report the leader's counts (sums over nodes stay right)
    for i, n in enumerate(defs_cluster.nodes):
        if i != li:
            text = metrics_text(n.metrics_port)
            assert metric(text, "rabbitmq_queue_messages_ready", queue="met-q") is None
            assert metric(text, "qq_raft_is_leader", queue="met-q") == 0
    # one message fetched without ack: 4 ready, 1 unacked; a consumer is counted
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", defs_cluster.nodes[0].port, credentials=pika.PlainCredentials("guest", "guest")))
    ch = conn.channel()
    method, _, body = ch.basic_get("met-q", auto_ack=False)
    assert method is not None
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=0)
    ch2.basic_consume("met-q", lambda *a: None)
    try:
        def state() -> tuple[float | None, ...]:
            text = metrics_text(lport)
            return tuple(metric(text, name, queue="met-q") for name in (
                "rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked",
                "rabbitmq_queue_consumers", "rabbitmq_queue_messages"))
        conn.process_data_events(0)
        got = wait_for(lambda: (s := state())[2] == 1 and s, what="the consumer in metrics")
        assert got[3] == 5  # ready + unacked
        assert got[1] is not None and got[1] >= 1  # the basic.get one (plus any delivered)
        api_q = a0.get("/api/queues/%2F/met-q")[1]
        assert api_q["consumers"] == 1
    finally:
        conn.close()
    wait_for(lambda: state() == (5, 0, 0, 5), what="messages returned after the close")
    # Raft metrics agree with quorum status and across nodes once idle
    def raft() -> list[tuple[float | None, float | None, float | None]]:
        out = []
        for n in defs_cluster.nodes:
            text = metrics_text(n.metrics_port)
            out.append(tuple(metric(text, name, queue="met-q") for name in (
                "rabbitmq_raft_term_total", "rabbitmq_raft_log_commit_index",
                "rabbitmq_raft_log_last_applied_index")))
        return out
    rows = wait_for(lambda: (r := raft()) and len(set(r)) == 1 and r[0][1] == r[0][2] and r,
                    what="idle replicas with equal indexes")
    term, commit, _ = rows[0]
    assert term is not None and term >= 1 and commit is not None and commit >= 6
    status = a0.get("/api/queues/%2F/met-q/quorum-status")[1]
    assert {m["commit_index"] for m in status if m["raft_state"] == "leader"} == {commit}
    text = metrics_text(lport)
    assert metric(text, "qq_queue_members", queue="met-q") == 3
    assert metric(text, "qq_queue_members_online", queue="met-q") == 3
    assert metric(text, "qq_raft_is_leader", queue="met-q") == 1
    assert metric(text, "qq_raft_leader_changes_total", queue="met-q") == 0
    latency = metric(text, "rabbitmq_raft_entry_commit_latency_seconds", queue="met-q")
    assert latency is not None and 0 <= latency < 30
    fsyncs = metric(text, "qq_wal_fsyncs_total")
    wal = metric(text, "qq_wal_bytes_total")
    assert fsyncs and wal
    # every WAL batch is in the sync-duration histogram; the loop-lag one
    # counts the sampler's wake-ups (five a second)
    # (the WAL writer thread may be between the two counters: one apart)
    syncs = metric(text, "qq_wal_sync_duration_seconds_count")
    assert syncs is not None and abs(syncs - fsyncs) <= 1
    assert metric(text, "qq_wal_sync_duration_seconds_bucket", le="+Inf") == syncs
    assert 0 < metric(text, "qq_wal_sync_duration_seconds_sum") < syncs  # type: ignore[operator]
    wakeups = metric(text, "qq_event_loop_lag_seconds_count")
    assert wakeups and metric(text, "qq_event_loop_lag_seconds_bucket", le="2.5") <= wakeups  # type: ignore[operator]
    publish(defs_cluster, li, "met-q", 1)
    text = metrics_text(lport)
    assert metric(text, "qq_wal_fsyncs_total") > fsyncs  # type: ignore[operator]
    assert metric(text, "qq_wal_bytes_total") > wal  # type: ignore[operator]
    assert metric(text, "qq_wal_sync_duration_seconds_count") > syncs  # type: ignore[operator]
    wait_for(lambda: metric(metrics_text(lport), "qq_event_loop_lag_seconds_count") > wakeups,  # type: ignore[operator]
             what="another sampler wake-up")
    assert metric(text, "qq_cluster_nodes_running") == 3
    assert metric(text, "rabbitmq_identity_info", rabbitmq_node=leader) == 1
    assert sum(metric(metrics_text(n.metrics_port), "qq_metadata_is_leader") or 0
               for n in defs_cluster.nodes) == 1
    assert a0.delete("/api/queues/%2F/met-q")[0] == 204


# ---------------------------------------------------------------- the OpenAPI document
def test_openapi_covers_every_route() -> None:
    doc = openapi_document()
    for method, path, _ in ROUTES:
        assert method.lower() in doc["paths"].get(path, {}), f"{method} {path} undocumented"
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == {(m, p) for m, p, _ in ROUTES}
    json.dumps(doc)  # serialisable


def test_openapi_copy_in_docs_is_current() -> None:
    path = ROOT_DIR / "docs" / "openapi.json"
    assert json.loads(path.read_text()) == openapi_document(), (
        "docs/openapi.json is stale: regenerate it with python -c 'import json; from "
        "broker.mgmt.openapi import openapi_document as d; print(json.dumps(d(), indent=2, "
        "sort_keys=True))' > docs/openapi.json")


def test_grafana_dashboard_uses_exported_metrics(defs_cluster: MgmtCluster) -> None:
    dash = json.loads((ROOT_DIR / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    used = {m for e in exprs for m in re.findall(r"\b((?:rabbitmq|qq)_[a-z_]+)\b", e)}
    exported = set()
    for n in defs_cluster.nodes:
        exported |= {line.split()[2] for line in metrics_text(n.metrics_port).splitlines()
                     if line.startswith("# TYPE ")}
    # a histogram is exported under its name; queries use its _bucket/_sum/_count series
    used = {base if (base := re.sub(r"_(bucket|sum|count)$", "", m)) in exported else m for m in used}
    assert len(used) >= 20
    assert used <= exported, f"the dashboard uses metrics nobody exports: {used - exported}"
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_vhosts_users_permissions_writes(defs_cluster: MgmtCluster) -> None:
    a0, a1, a2 = defs_cluster.apis
    mgr = a0.as_user("mgr", "pw")
    assert mgr.put("/api/vhosts/v-new", {})[0] == 403
    assert a0.put("/api/vhosts/v-new", {"description": "d", "tags": "a,b",
                                        "default_queue_type": "quorum"}) == (201, None)
    assert a0.put("/api/vhosts/v-new", {"description": "d2"}) == (204, None)
    vh = wait_for(lambda: (r := a2.get("/api/vhosts/v-new"))[0] == 200 and r[1], what="vhost")
    assert vh["description"] in ("d", "d2")
    wait_for(lambda: a2.get("/api/vhosts/v-new")[1]["description"] == "d2", what="update")
    assert {x["name"] for x in a1.get("/api/exchanges/v-new")[1]} >= {"", "amq.direct"}
    assert a0.put("/api/vhosts/v-bad", {"default_queue_type": "stream"})[0] == 400
    # a user, with a password, tags as a list; then permissions in the new vhost
    assert a1.put("/api/users/carol", {"password": "s3cret", "tags": ["management"]}) == (201, None)
    carol = a0.as_user("carol", "s3cret")
    wait_for(lambda: carol.get("/api/overview")[0] == 200, what="carol can log in")
    assert carol.get("/api/vhosts/v-new")[0] == 403
    assert a1.get("/api/permissions/v-new/carol")[0] == 404
    perm = {"configure": "^c-", "write": ".*", "read": ".*"}
    assert a1.put("/api/permissions/v-new/carol", perm) == (201, None)
    assert a1.put("/api/permissions/v-new/carol", perm) == (204, None)
    assert a1.get("/api/permissions/v-new/carol")[1] == {"user": "carol", "vhost": "v-new", **perm}
    wait_for(lambda: carol.get("/api/vhosts/v-new")[0] == 200, what="carol sees v-new")
    assert carol.put("/api/queues/v-new/c-q", QQ)[0] == 201
    assert carol.put("/api/queues/v-new/other", QQ)[0] == 403
    assert a1.put("/api/permissions/v-new/carol", {"configure": "(", "write": "", "read": ""})[0] == 400
    assert a1.put("/api/permissions/v-new/carol", {"configure": ".*"})[0] == 400
    assert a1.put("/api/permissions/v-new/nobody", perm)[0] == 404
    # tags as a string; keeping the password when none is given
    assert a1.put("/api/users/carol", {"tags": "monitoring"}) == (204, None)
    wait_for(lambda: a0.get("/api/users/carol")[1]["tags"] == ["monitoring"], what="tags updated")
    assert carol.get("/api/overview")[0] == 200
    assert a1.put("/api/users/carol", {"password": "a", "password_hash": "b"})[0] == 400
    assert a1.put("/api/users/carol", {"tags": [1]})[0] == 400
    assert carol.put("/api/users/carol", {"tags": "administrator"})[0] == 403
    # clear permissions, delete the vhost (its queue goes with it), delete the user
    assert a1.delete("/api/permissions/v-new/carol") == (204, None)
    assert a1.delete("/api/permissions/v-new/carol")[0] == 404
    assert a0.delete("/api/vhosts/v-new") == (204, None)
    wait_for(lambda: a2.get("/api/queues/v-new/c-q")[0] == 404, what="queue gone with vhost")
    assert a0.delete("/api/vhosts/v-new")[0] == 404
    assert a0.delete("/api/users/carol") == (204, None)
    wait_for(lambda: carol.get("/api/overview")[0] == 401, what="carol gone")
    assert a0.delete("/api/users/carol")[0] == 404
    assert a0.get("/api/users/carol")[0] == 404
