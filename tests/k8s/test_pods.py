"""Broker pods as the chart makes them, played on loopback: real broker
processes started with the ConfigMap's quorumq.conf that `helm template`
renders, each given what the StatefulSet gives a pod (POD_NAME,
POD_NAMESPACE, the Secret's credentials as QQ__ environment) plus one
override a pod does not need: its host name is its own loopback address
(QQ__CLUSTER__STATEFULSET__HOST_TEMPLATE=127.0.1.1{ordinal}) instead of
the headless service's DNS name.

One scenario, in order: ordinals 0..2 form the cluster; the chart's helm-test
script publishes and consumes a confirmed message; a pod added later joins
and becomes ready; pod 0 restarts through its preStop (hands leaderships
away, then stops) and rejoins as itself; a preStop that cannot keep a quorum
waits, says why, and gives up in time; a scale-down runs the preStop of the
leaving pod, which leaves the cluster, metadata group included (proved by a
metadata change succeeding with 2 of the 3 remaining nodes up); no confirmed
message is lost.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.e2e.broker_proc import free_port

from .helm import CHART, ROOT, one, render

NS, RELEASE = "messaging", "qq"
STS = "qq-quorumq"
USER, PASSWORD = "admin", "k8s-test-password"


def addr(ordinal: int) -> str:
    return f"127.0.1.1{ordinal}"


def node_name(ordinal: int) -> str:
    return f"rabbit@{addr(ordinal)}"


class Pod:
    def __init__(self, ordinal: int, conf: Path, ports: dict[str, int], root: Path) -> None:
        self.ordinal = ordinal
        self.name = f"{STS}-{ordinal}"
        self.conf = conf
        self.ports = ports
        self.data = root / self.name  # the pod's PVC
        self.log_path = root / f"{self.name}.log"
        self.secret = root / "cluster-secret"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        a = addr(self.ordinal)
        return {**os.environ, "POD_NAME": self.name, "POD_NAMESPACE": NS, "HOSTNAME": self.name,
                "QQ__DEFAULT_USER": USER, "QQ__DEFAULT_PASS": PASSWORD,
                "QQCTL_URL": self.mgmt_url, "QQCTL_USER": USER, "QQCTL_PASSWORD": PASSWORD,
                "QQ__CLUSTER__STATEFULSET__HOST_TEMPLATE": "127.0.1.1{ordinal}",
                "QQ__NODE__DATA_DIR": str(self.data), "QQ__CLUSTER__SECRET_FILE": str(self.secret),
                "QQ__LISTENERS__TCP__BIND": a, "QQ__MANAGEMENT__TCP__BIND": a,
                "QQ__PROMETHEUS__TCP__BIND": a, "QQ__CLUSTER__BIND": a,
                "QQ__CLUSTER__FORMATION_TIMEOUT_MS": "60000"}

    @property
    def mgmt_url(self) -> str:
        return f"http://{addr(self.ordinal)}:{self.ports['management']}"

    def start(self) -> Pod:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "broker", "--config", str(self.conf)],
                                     cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.mgmt_url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Authorization", "Basic " + b64encode(f"{USER}:{PASSWORD}".encode()).decode())
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw.strip() else None
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            return 0, str(exc)

    def ready(self) -> bool:
        return self.api("GET", "/api/health/ready")[0] == 200

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not ready in {timeout}s:\n{self.log()}")
            time.sleep(0.2)

    def pre_stop(self, desired: int, wait: float = 60) -> subprocess.CompletedProcess[str]:
        """What the kubelet runs before stopping the pod (the chart's command)."""
        sts = one(render(), "StatefulSet")
        cmd = sts["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        assert cmd[0] == "qqctl"
        args = cmd[1:cmd.index("--wait")] + ["--wait", str(wait), "--desired-replicas", str(desired)]
        return subprocess.run([sys.executable, "-m", "broker.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=wait + 60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""


@pytest.fixture
def statefulset(tmp_path: Path) -> Any:
    ports = {k: free_port() for k in ("amqp", "management", "metrics", "cluster")}
    sets = [f"ports.{k}={v}" for k, v in ports.items()]
    conf = one(render("--set", ",".join(sets), namespace=NS, release=RELEASE),
               "ConfigMap", "-config")["data"]["quorumq.conf"]
    (tmp_path / "quorumq.conf").write_text(conf)
    (tmp_path / "cluster-secret").write_text("s3cret-shared-by-every-pod-0123456789\n")
    pods: dict[int, Pod] = {}

    def pod(i: int) -> Pod:
        if i not in pods:
            pods[i] = Pod(i, tmp_path / "quorumq.conf", ports, tmp_path)
        return pods[i]
    yield pod, ports
    for p in pods.values():
        p.stop()


def amqp(pod: Pod) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        addr(pod.ordinal), pod.ports["amqp"], credentials=pika.PlainCredentials(USER, PASSWORD)))


def leaders(pod: Pod) -> dict[str, str]:
    status, queues = pod.api("GET", "/api/queues/%2F")
    assert status == 200, queues
    return {q["name"]: q.get("leader") for q in queues if q.get("type") == "quorum"}


def eventually(cond: Any, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_pods_form_join_restart_and_leave(statefulset: Any) -> None:
    pod, ports = statefulset
    # ---- ordinals 0..2 start together (podManagementPolicy: Parallel) and form the cluster
    for i in range(3):
        pod(i).start()
    for i in range(3):
        pod(i).wait_ready()
    status, nodes = pod(0).api("GET", "/api/nodes")
    assert sorted(n["name"] for n in nodes) == [node_name(i) for i in range(3)]

    # ---- the chart's `helm test` script, for real
    smoke = subprocess.run(
        [sys.executable, str(CHART / "files" / "smoke_test.py")], capture_output=True, text=True,
        timeout=60, env={**os.environ, "QQ_HOST": addr(1), "QQ_PORT": str(ports["amqp"]),
                         "QQ_USER": USER, "QQ_PASSWORD": PASSWORD})
    assert smoke.returncode == 0, smoke.stderr
    assert "confirmed" in smoke.stdout and "ok" in smoke.stdout

    # ---- confirmed messages in three queues (one led by each pod: balanced locator)
    conn = amqp(pod(0))
    ch = conn.channel()
    ch.confirm_delivery()
    sent: dict[str, list[bytes]] = {}
    for qn in ("orders-a", "orders-b", "orders-c"):
        ch.queue_declare(qn, durable=True, arguments={"x-queue-type": "quorum"})
        sent[qn] = [f"{qn}-{i}".encode() for i in range(20)]
        for body in sent[qn]:
            ch.basic_publish("", qn, body, pika.BasicProperties(delivery_mode=2))
    conn.close()

    # ---- scale-up: pod 3 starts with an empty volume and joins the running cluster
    pod(3).start().wait_ready()
    status, nodes = pod(3).api("GET", "/api/nodes")
    assert node_name(3) in {n["name"] for n in nodes}

    # ---- pod 0 restarts (rolling update): preStop hands leaderships away first
    result = pod(0).pre_stop(desired=4)
    assert result.returncode == 0, result.stderr
    assert "RESTARTING" in result.stderr
    # (the metadata records the new leaders asynchronously)
    assert eventually(lambda: node_name(0) not in leaders(pod(1)).values()), \
        (leaders(pod(1)), result.stderr)
    pod(0).stop()
    pod(0).start().wait_ready()  # rejoins as itself, from its volume

    # ---- a preStop that cannot keep a quorum waits, says why, and gives up in time
    pod(2).stop()  # queues on {0,1,2} now need both 0 and 1
    critical_before = pod(1).api("GET", "/api/health/checks/node-is-quorum-critical")
    assert critical_before[0] == 503
    t0 = time.monotonic()
    result = pod(1).pre_stop(desired=4, wait=3)
    assert time.monotonic() - t0 < 20
    assert result.returncode == 75, result.stderr
    assert "waiting: stopping now would leave" in result.stderr
    assert "giving up waiting" in result.stderr
    pod(2).start().wait_ready()

    # ---- scale-down 4 -> 3: pod 3's preStop sees ordinal 3 >= 3 and leaves
    result = pod(3).pre_stop(desired=3)
    assert result.returncode == 0, result.stderr
    assert "LEAVING" in result.stderr and "has left the cluster" in result.stderr
    for qn in sent:
        status, q = pod(0).api("GET", f"/api/queues/%2F/{qn}")
        assert node_name(3) not in q["members"], q
    pod(3).stop()
    # every remaining node forgets pod 3 without a restart: /api/nodes lists 0..2
    for i in range(3):
        assert eventually(lambda i=i: sorted(n["name"] for n in pod(i).api("GET", "/api/nodes")[1])
                          == [node_name(j) for j in range(3)]), (i, pod(i).api("GET", "/api/nodes"))
    # The metadata group is {0,1,2} again: with 2 of them up it still takes
    # changes (as a 4-voter group it would need 3).
    pod(2).stop()
    conn = amqp(pod(0))
    ch = conn.channel()
    ch.queue_declare("after-scale-down", durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    pod(2).start().wait_ready()

    # ---- nothing confirmed was lost
    assert_all_delivered(pod(1), sent)


def assert_all_delivered(p: Any, sent: dict[str, list[bytes]]) -> None:
    """Every body of `sent` (queue -> bodies) can be got through pod `p`."""
    conn = amqp(p)
    ch = conn.channel()
    for qn, bodies in sent.items():
        got = []
        deadline = time.monotonic() + 30
        while len(got) < len(bodies) and time.monotonic() < deadline:
            method, _props, body = ch.basic_get(qn, auto_ack=True)
            if method is None:
                time.sleep(0.05)
                continue
            got.append(body)
        assert sorted(got) == sorted(bodies), qn
    conn.close()


def test_pods_leaving_together_never_drain_onto_each_other(statefulset: Any) -> None:
    """A scale-down 5 -> 3 with the chart's podManagementPolicy: Parallel runs
    the preStops of pods 3 and 4 at the same time. Each drain must place its
    replacement members on pods 0..2 only: before, one drain could move a
    member onto the other leaving pod, whose preStop then gave up at its bound
    (exit 75) still holding it."""
    import threading

    pod, _ports = statefulset
    for i in range(3):
        pod(i).start()
    for i in range(3):
        pod(i).wait_ready()
    for i in (3, 4):
        pod(i).start().wait_ready()
    conn = amqp(pod(0))
    ch = conn.channel()
    ch.confirm_delivery()
    sent: dict[str, list[bytes]] = {}
    for k in range(4):  # every queue has a member on every pod, 3 and 4 included
        qn = f"wide-{k}"
        ch.queue_declare(qn, durable=True, arguments={"x-queue-type": "quorum",
                                                      "x-quorum-initial-group-size": 5})
        sent[qn] = [f"{qn}-{i}".encode() for i in range(10)]
        for body in sent[qn]:
            ch.basic_publish("", qn, body, pika.BasicProperties(delivery_mode=2))
    conn.close()
    for qn in sent:
        assert len(pod(0).api("GET", f"/api/queues/%2F/{qn}")[1]["members"]) == 5

    results: dict[int, subprocess.CompletedProcess[str]] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, pod(i).pre_stop(desired=3)))
               for i in (3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in (3, 4):
        assert results[i].returncode == 0, results[i].stderr
        assert "LEAVING" in results[i].stderr and "has left the cluster" in results[i].stderr
    remaining = {node_name(i) for i in range(3)}
    for qn in sent:
        status, q = pod(0).api("GET", f"/api/queues/%2F/{qn}")
        assert set(q["members"]) == remaining, q
    for i in (3, 4):
        pod(i).stop()
    assert_all_delivered(pod(1), sent)
