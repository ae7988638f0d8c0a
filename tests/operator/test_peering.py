"""kopf peering: two operator replicas, only one acts (issue 11).

Two real operator processes (`python -m quorumq_operator`, the image's entry
point, plus the test's login plugin) with the same peering name and
different priorities run against the stand-in API; the peering object is
the chart's (`crds/kopf-peering.yaml`). The higher-priority replica handles
a new QuorumQueue while the other, which was active alone before, yields and
stays paused; once it stops, the other takes over and handles the next one.
What each did is read from its log and from the broker's real state.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from . import manifests as m
from .conftest import GROUP, NS, KubeApi, OpCluster, install_broker_statefulset, wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
RESUMED = "Resuming operations after the pause"  # kopf's log line when a replica may act
PAUSING = "Pausing operations in favour of"  # ... and when it yields to another


class Replica:
    def __init__(self, name: str, priority: int, kube: KubeApi, log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        env = {**os.environ, "QQ_OPERATOR_NAMESPACES": NS, "QQ_OPERATOR_PEERING": "quorumq",
               "QQ_OPERATOR_PEERING_PRIORITY": str(priority), "QQ_OPERATOR_LIVENESS_PORT": "0",
               "QQ_OPERATOR_METRICS_PORT": "0", "QQ_OPERATOR_VERBOSE": "1",
               "QQ_TEST_KUBE_URL": kube.url, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'operator'}"}
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "quorumq_operator", "-m", "tests.operator.kopf_login"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def handled(self, queue: str) -> bool:
        """This replica ran a QuorumQueue handler for `queue` (kopf's log lines
        name the object as [namespace/name])."""
        return any(f"[{NS}/{queue}]" in line and "Handler" in line and "succeeded" in line
                   for line in self.log().splitlines())

    def active(self) -> bool:
        """Every replica starts paused; kopf logs each change of its mind.
        Active = the last such line says it resumed."""
        state = False
        for line in self.log().splitlines():
            if RESUMED in line:
                state = True
            elif PAUSING in line:
                state = False
        return state

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def replicas(kube: KubeApi, brokers: OpCluster, tmp_path: Path) -> Iterator[list[Replica]]:
    install_broker_statefulset(kube, brokers)
    kube.create({"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                 "metadata": {"name": "quorumq", "namespace": NS}, "status": {}})
    # the low-priority replica starts alone and is active; the high one
    # joins later, and the low one must yield to it
    low = Replica("low", 50, kube, tmp_path)
    reps = [low]
    try:
        wait_for(low.active, 60, "the lone low replica active", interval=0.2)
        reps.insert(0, Replica("high", 100, kube, tmp_path))
        yield reps
    finally:
        for r in reps:
            r.stop()


def _peers(kube: KubeApi) -> dict[str, Any]:
    obj = kube.get("kopf.dev/v1", "kopfpeerings", "quorumq") or {}
    return dict(obj.get("status") or {})


def test_only_the_higher_priority_replica_acts_and_the_other_takes_over(
        kube: KubeApi, brokers: OpCluster, replicas: list[Replica]) -> None:
    high, low = replicas
    # both announce themselves in the peering object; the lower one pauses
    peers = wait_for(lambda: (p := _peers(kube)) and len(p) == 2 and p, 60,
                     "both replicas in the peering object")
    assert sorted(int(v["priority"]) for v in peers.values()) == [50, 100]
    # once both see each other only the highest-priority one is active
    wait_for(lambda: high.active() and not low.active(), 60, "only the high replica active",
             interval=0.2)
    assert PAUSING in low.log()  # it yielded

    kube.create(m.quorum_queue("peer-one", NS))
    wait_for(lambda: brokers.apis[0].queue("peer-one"), 60, "peer-one declared in the broker")
    wait_for(lambda: high.handled("peer-one"), 30, "the high replica handled peer-one")
    assert not low.handled("peer-one"), low.log()[-3000:]
    assert not low.active()  # still paused while the high replica is alive

    # the active replica goes away: the other resumes and acts
    high.stop()
    wait_for(lambda: len(_peers(kube)) == 1, 60, "the stopped replica left the peering object")
    wait_for(low.active, 60, "the low replica resumed", interval=0.2)
    kube.create(m.quorum_queue("peer-two", NS))
    wait_for(lambda: brokers.apis[0].queue("peer-two"), 60, "peer-two declared by the remaining replica")
    wait_for(lambda: low.handled("peer-two"), 30, "the low replica handled peer-two")
    # kopf logs the handler's success before it patches the status: await it
    wait_for(lambda: ((kube.get(GROUP, "quorumqueues", "peer-two") or {}).get("status") or {}).get("members"),
             30, "peer-two's status has its members (written by the remaining replica)")
