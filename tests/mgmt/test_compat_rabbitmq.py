"""The same management API requests against RabbitMQ 3.10 (rabbitmq_management)
and against our broker: status codes, error shapes and JSON field names must
agree, except for the deliberate differences listed in DIFFERENCES.

Deliberate differences (each asserted below, so a change on either side shows):
- unknown keys in a request body: RabbitMQ ignores them, we answer 400 (the
  issue asks for every bad request to be refused);
- an authenticated user lacking the needed tag or vhost access: RabbitMQ 401
  "not_authorised", we 403 (HTTP's meaning: the credentials were fine);
- DELETE ?if-unused=true / ?if-empty=true on a quorum queue: RabbitMQ 3.10
  refuses them (400, "not supported by quorum queues"); we implement them as
  for classic queues (the issue asks for them);
- a 401 without credentials: RabbitMQ sends no body, we send {error, reason}.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from bench import rabbitmq_local
from tests.e2e.broker_proc import BrokerProcess, free_port, rabbitmq_port_pair

from .conftest import Api, wait_for


class ManagementRabbit(rabbitmq_local.RabbitNode):
    @property
    def env(self) -> dict[str, str]:
        env = super().env
        env["RABBITMQ_ENABLED_PLUGINS"] = "rabbitmq_management,rabbitmq_prometheus"
        return env


PROMETHEUS_PORT: dict[str, int] = {}


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, int]]:
    if not rabbitmq_local.installed():
        pytest.skip("rabbitmq-server is not installed (make test installs it when run as root)")
    port, mport, pport = rabbitmq_port_pair(), free_port(), free_port()
    PROMETHEUS_PORT["rabbit"] = pport
    # RabbitMQ runs as the `rabbitmq` user under root and cannot enter pytest's
    # 0700 tmp root (which concurrent pytest sessions keep resetting to 0700).
    base = Path(tempfile.mkdtemp(prefix="qq-mgmt-rabbit-"))
    base.chmod(0o755)
    node = ManagementRabbit(f"qqmgmt{os.getpid()}@localhost", port, base / "node")
    node.start(f"management.tcp.port = {mport}\nmanagement.tcp.ip = 127.0.0.1\n"
               f"prometheus.tcp.port = {pport}\nprometheus.tcp.ip = 127.0.0.1\n")
    api = Api(mport)
    try:
        wait_for(lambda: _up(api), timeout=60, what="RabbitMQ's management API")
        yield api, port
    finally:
        _kill(node)
        shutil.rmtree(base, ignore_errors=True)


def _kill(node: rabbitmq_local.RabbitNode) -> None:
    """SIGKILL the throw-away node (a clean `rabbitmqctl stop` takes ~10 s)."""
    import signal

    try:
        pid = int((node.base / "pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        node.stop()


def _up(api: Api) -> bool:
    try:
        return api.get("/api/overview")[0] == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, int]]:
    b = BrokerProcess(tmp_path_factory.mktemp("ours-mgmt") / "node", management_port=free_port(),
                      metrics_port=free_port())
    b.start()
    PROMETHEUS_PORT["ours"] = b.metrics_port
    try:
        yield Api(b.management_port), b.port
    finally:
        b.stop()


QQ = {"durable": True, "arguments": {"x-queue-type": "quorum"}}
POLICY = {"pattern": "^cq", "definition": {"max-length": 3}, "apply-to": "queues", "priority": 1}
PERM = {"configure": ".*", "write": ".*", "read": ".*"}

# (method, path, body or raw bytes, user) in order; both brokers must give the same status.
SCENARIO: list[tuple[str, str, Any, str]] = [
    ("GET", "/api/overview", None, "wrong"),
    ("PUT", "/api/queues/%2F/cq", QQ, "guest"),
    ("PUT", "/api/queues/%2F/cq", QQ, "guest"),
    ("PUT", "/api/queues/%2F/cq", {"durable": True, "arguments": {
        "x-queue-type": "quorum", "x-max-length": 5}}, "guest"),
    ("PUT", "/api/queues/%2F/cq2", {"durable": "yes"}, "guest"),
    ("PUT", "/api/queues/%2F/cq2", b"{bad", "guest"),
    ("PUT", "/api/queues/nope/x", {}, "guest"),
    ("GET", "/api/queues/%2F/cq", None, "guest"),
    ("GET", "/api/queues/%2F/none", None, "guest"),
    ("PUT", "/api/policies/%2F/p1", POLICY, "guest"),
    ("PUT", "/api/policies/%2F/p1", POLICY, "guest"),
    ("GET", "/api/policies/%2F/p1", None, "guest"),
    ("PUT", "/api/policies/%2F/p2", {"pattern": ".*", "definition": {"max-length": -1}}, "guest"),
    ("PUT", "/api/policies/%2F/p2", {"pattern": "(", "definition": {"max-length": 1}}, "guest"),
    ("PUT", "/api/policies/%2F/p2", {"definition": {"max-length": 1}}, "guest"),
    ("GET", "/api/policies/%2F/none", None, "guest"),
    ("DELETE", "/api/policies/%2F/none", None, "guest"),
    ("DELETE", "/api/policies/%2F/p1", None, "guest"),
    ("PUT", "/api/operator-policies/%2F/op1", {"pattern": "^cq", "definition": {
        "max-length": 2}}, "guest"),
    ("DELETE", "/api/operator-policies/%2F/op1", None, "guest"),
    ("PUT", "/api/queues/%2F/classic", {"durable": True}, "guest"),
    ("PUBLISH", "classic", 2, "guest"),
    ("DELETE", "/api/queues/%2F/classic?if-empty=true", None, "guest"),  # holds messages
    ("DELETE", "/api/queues/%2F/classic/contents", None, "guest"),
    ("DELETE", "/api/queues/%2F/none/contents", None, "guest"),
    ("DELETE", "/api/queues/%2F/classic?if-empty=true", None, "guest"),
    ("PUBLISH", "cq", 2, "guest"),
    ("DELETE", "/api/queues/%2F/cq/contents", None, "guest"),
    ("DELETE", "/api/queues/%2F/cq", None, "guest"),
    ("DELETE", "/api/queues/%2F/cq", None, "guest"),
    ("GET", "/api/health/checks/alarms", None, "guest"),
    ("GET", "/api/health/checks/node-is-quorum-critical", None, "guest"),
    ("PUT", "/api/users/mon", {"password": "pw", "tags": "monitoring"}, "guest"),
    ("PUT", "/api/users/mon", {"password": "pw", "tags": "monitoring"}, "guest"),
    ("PUT", "/api/users/plain", {"password": "pw", "tags": ""}, "guest"),
    ("GET", "/api/overview", None, "mon"),
    ("PUT", "/api/vhosts/v1", {}, "guest"),
    ("PUT", "/api/vhosts/v1", {}, "guest"),
    ("PUT", "/api/permissions/v1/mon", PERM, "guest"),
    ("PUT", "/api/permissions/v1/mon", PERM, "guest"),
    ("GET", "/api/permissions/v1/mon", None, "guest"),
    ("PUT", "/api/permissions/v1/mon", {"configure": "("}, "guest"),
    ("DELETE", "/api/vhosts/v1", None, "guest"),
    ("DELETE", "/api/vhosts/v1", None, "guest"),
    ("DELETE", "/api/users/mon", None, "guest"),
    ("DELETE", "/api/users/mon", None, "guest"),
    ("GET", "/api/nodes", None, "guest"),
    ("GET", "/api/vhosts", None, "guest"),
    ("GET", "/api/users", None, "guest"),
    ("GET", "/api/permissions", None, "guest"),
    ("GET", "/api/exchanges/%2F", None, "guest"),
    ("PATCH", "/api/overview", None, "guest"),
    ("GET", "/api/no-such-thing", None, "guest"),
]
PASSWORDS = {"guest": "guest", "wrong": "nope", "mon": "pw", "plain": "pw"}


def run(api: Api, amqp_port: int) -> list[tuple[int, Any]]:
    out = []
    for method, path, body, user in SCENARIO:
        if method == "PUBLISH":
            _publish(amqp_port, path, body)
            out.append((0, None))
            continue
        raw = body if isinstance(body, bytes) else None
        a = api.as_user(user if user != "wrong" else "guest", PASSWORDS[user])
        out.append(a.call(method, path, None if raw is not None else body, raw=raw))
    return out


def _publish(port: int, queue: str, n: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", queue, f"m{i}".encode())
    conn.close()


def test_same_statuses_and_shapes_as_rabbitmq(rabbit: tuple[Api, int], ours: tuple[Api, int]) -> None:
    theirs_api, theirs_amqp = rabbit
    ours_api, ours_amqp = ours
    theirs, mine = run(theirs_api, theirs_amqp), run(ours_api, ours_amqp)
    for (method, path, _, user), (ts, tb), (os_, ob) in zip(SCENARIO, theirs, mine, strict=True):
        where = f"{method} {path} as {user}: RabbitMQ {ts} {tb!r:.200} / ours {os_} {ob!r:.200}"
        assert ts == os_, where
        if ts >= 400 and isinstance(tb, dict):  # RabbitMQ's error shape
            assert isinstance(ob, dict) and ob.keys() >= {"error", "reason"}, where
        if ts == 200 and isinstance(tb, dict) and isinstance(ob, dict):
            shared = {"status", "vhost", "name", "pattern", "apply-to", "definition", "priority",
                      "user", "configure", "write", "read"}
            for k in shared & tb.keys():
                assert ob.get(k) == tb[k], f"{where}: field {k}"
        if ts == 200 and isinstance(tb, list) and tb and isinstance(ob, list) and ob:
            missing = _core_keys(tb[0]) - ob[0].keys()
            assert not missing, f"{where}: we lack {missing}"
    by_path = {(m, p, u): (t, o) for (m, p, _, u), t, o in zip(SCENARIO, theirs, mine, strict=True)}
    (ts, tq), (os_, oq) = by_path[("GET", "/api/queues/%2F/cq", "guest")]
    for key in ("name", "vhost", "type", "durable", "auto_delete", "exclusive", "arguments"):
        assert oq[key] == tq[key], key
    for key in ("leader", "members", "online"):  # node names differ; shapes agree
        assert type(oq[key]) is type(tq[key]), key


def _core_keys(sample: dict[str, Any]) -> set[str]:
    """RabbitMQ's fields we promise in list answers (not its stats and internals)."""
    core = {"name", "vhost", "type", "running", "durable", "auto_delete", "internal",
            "arguments", "tags", "description", "password_hash", "hashing_algorithm",
            "user", "configure", "write", "read", "default_queue_type", "tracing", "metadata",
            "cluster_state", "limits"}
    return core & sample.keys()


def test_documented_differences(rabbit: tuple[Api, int], ours: tuple[Api, int]) -> None:
    (theirs, _), (mine, _) = rabbit, ours
    for api in (theirs, mine):
        assert api.put("/api/users/nomgmt", {"password": "pw", "tags": "monitoring"})[0] in (201, 204)
        assert api.put("/api/queues/%2F/diff-q", QQ)[0] == 201
    # unknown body keys
    assert theirs.put("/api/queues/%2F/diff-q2", {"colour": 1})[0] == 201
    assert mine.put("/api/queues/%2F/diff-q2", {"colour": 1})[0] == 400
    # a user without the administrator tag
    ts, tb = theirs.as_user("nomgmt", "pw").get("/api/users")
    os_, ob = mine.as_user("nomgmt", "pw").get("/api/users")
    assert (ts, tb["error"]) == (401, "not_authorised") and os_ == 403 and ob["reason"]
    # if-empty / if-unused on a quorum queue
    assert theirs.delete("/api/queues/%2F/diff-q?if-empty=true")[0] == 400
    assert theirs.delete("/api/queues/%2F/diff-q?if-unused=true")[0] == 400
    assert mine.delete("/api/queues/%2F/diff-q?if-unused=true&if-empty=true")[0] == 204
    # no credentials
    assert theirs.get("/api/overview", auth=False) == (401, None)
    status, body = mine.get("/api/overview", auth=False)
    assert status == 401 and body["error"] == "not_authorized"


def test_ours_is_up(ours: tuple[Api, int]) -> None:
    assert ours[0].get("/api/health/ready", auth=False) == (200, {"status": "ok"})


def _families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_metric_names_are_rabbitmq_prometheus_names(rabbit: tuple[Api, int],
                                                    ours: tuple[Api, int]) -> None:
    """Every `rabbitmq_*` metric we export exists under that name (and type) in
    rabbitmq_prometheus's per-object or aggregated endpoint, so existing
    dashboards work."""
    for api, _ in (rabbit, ours):
        assert api.put("/api/queues/%2F/metrics-q", QQ)[0] in (201, 204)
    _publish(rabbit[1], "metrics-q", 1)
    _publish(ours[1], "metrics-q", 1)

    def scrape(port: int, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as resp:
            return str(resp.read().decode())

    def rabbit_types() -> dict[str, str]:
        # per-object (queue metrics) and the aggregated endpoint (node metrics such as alarms)
        text = scrape(PROMETHEUS_PORT["rabbit"], "/metrics/per-object") + "\n" + \
            scrape(PROMETHEUS_PORT["rabbit"], "/metrics")
        return {ln.split()[2]: ln.split()[3] for ln in text.splitlines() if ln.startswith("# TYPE ")}
    theirs = wait_for(lambda: (t := rabbit_types()) and "rabbitmq_raft_term_total" in t and t,
                      timeout=30, what="RabbitMQ's raft metrics")
    text = scrape(PROMETHEUS_PORT["ours"], "/metrics")
    mine = {ln.split()[2]: ln.split()[3] for ln in text.splitlines() if ln.startswith("# TYPE ")}
    ours_rabbit = {n for n in mine if n.startswith("rabbitmq_")}
    assert {"rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked",
            "rabbitmq_queue_consumers", "rabbitmq_raft_term_total",
            "rabbitmq_raft_log_commit_index", "rabbitmq_raft_log_last_applied_index",
            "rabbitmq_raft_entry_commit_latency_seconds"} <= ours_rabbit
    unknown = ours_rabbit - theirs.keys()
    assert not unknown, f"not rabbitmq_prometheus names: {unknown}"
    for name in ours_rabbit:
        assert mine[name] == theirs[name], f"{name}: ours {mine[name]}, RabbitMQ {theirs[name]}"
