"""Resource alarms (issue 15): a node whose disk runs low blocks publishers on
every node with connection.blocked while consumers keep draining; nothing
confirmed is lost; publishing resumes when space returns.

Needs root (it mounts a small tmpfs under one node's data directory); CI runs
as root.
"""
from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.mgmt.conftest import MgmtCluster, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

LIMIT = 4 << 20  # disk_free_limit.absolute
QQ = {"x-queue-type": "quorum"}


class Publisher(threading.Thread):
    """Confirmed publishes of 1, 2, 3... on one connection until stopped;
    notes connection.blocked / unblocked as the client library reports them."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.confirmed: list[int] = []
        self.blocked = threading.Event()
        self.unblocked = threading.Event()
        self.reasons: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", self.port, client_properties={"connection_name": "alarm-publisher"}))
            conn.add_on_connection_blocked_callback(self._on_blocked)
            conn.add_on_connection_unblocked_callback(lambda *_: self.unblocked.set())
            ch = conn.channel()
            ch.confirm_delivery()
            n = 0
            while not self.stop.is_set():
                n += 1
                ch.basic_publish("", "alarm-q", str(n).encode() * 100,
                                 pika.BasicProperties(delivery_mode=2))
                self.confirmed.append(n)  # returns once confirmed (raises on a nack)
                conn.process_data_events(0)  # hands over queued blocked/unblocked callbacks
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _on_blocked(self, _conn: object, method: object) -> None:
        self.reasons.append(method.method.reason)  # type: ignore[attr-defined]
        self.blocked.set()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[MgmtCluster, Path]]:
    mnt = tmp_path / "n3mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "qqalarm", str(mnt)], check=True)
    c = MgmtCluster(tmp_path / "c", extra=(
        f"disk_free_limit.absolute = {LIMIT}\nalarms.check_interval_ms = 100\n"
        "raft.wal_max_size_bytes = 1048576\n"))
    c.nodes[2].data_dir = mnt / "data"
    c.nodes[2].log_path = tmp_path / "n3.log"  # not on the small disk
    try:
        c.start()
        yield c, mnt
    finally:
        c.kill_all()
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill_to(mnt: Path, free_left: int) -> Path:
    """A filler file that leaves about `free_left` bytes free on the tmpfs."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - free_left))
    return filler


def test_low_disk_on_one_node_blocks_publishers_everywhere_and_loses_nothing(
        cluster: tuple[MgmtCluster, Path]) -> None:
    c, mnt = cluster
    n1, n2, n3 = c.nodes
    setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", n1.port))
    setup.channel().queue_declare("alarm-q", durable=True, arguments=QQ)
    setup.close()
    pub = Publisher(n1.port)  # on node 1: the low disk is node 3's
    pub.start()
    wait_for(lambda: len(pub.confirmed) >= 50, what="publishing under way")

    def publisher_state() -> str | None:
        for x in c.apis[0].get("/api/connections")[1]:
            if x["client_properties"].get("connection_name") == "alarm-publisher":
                return str(x["state"])
        return None

    assert publisher_state() == "running"
    filler = _fill_to(mnt, LIMIT // 2)
    # (pika's blocking adapter hands the connection.blocked callback over only
    # once the publish it is waiting in returns: the broker says it here)
    wait_for(lambda: publisher_state() == "blocked", what="the publisher blocked")
    status, body = c.apis[0].get("/api/health/checks/alarms")
    assert status == 503 and {"node": n3.name, "resource": "disk"} in body["alarms"], body
    status, body = c.apis[2].get("/api/health/checks/local-alarms")
    assert status == 503
    assert c.apis[0].get("/api/health/checks/local-alarms")[0] == 200  # node 1 has none itself
    nodes = {x["name"]: x for x in c.apis[0].get("/api/nodes")[1]}
    assert nodes[n3.name]["disk_free_alarm"] is True and nodes[n1.name]["disk_free_alarm"] is False
    assert nodes[n3.name]["disk_free"] < nodes[n3.name]["disk_free_limit"] == LIMIT
    blocked_at = len(pub.confirmed)

    # consumers keep draining while publishers are blocked, on any node
    got: list[int] = []
    cons = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", n2.port))
    ch = cons.channel()
    for _ in range(20):
        method, _props, body = ch.basic_get("alarm-q")
        assert method is not None, "a consumer could not drain during the alarm"
        ch.basic_ack(method.delivery_tag)
        got.append(int(body[: len(body) // 100]))
    assert len(pub.confirmed) <= blocked_at + 1  # the blocked publisher made no progress

    filler.unlink()
    wait_for(lambda: publisher_state() == "running", what="the publisher unblocked")
    status, _ = c.apis[0].get("/api/health/checks/alarms")
    assert status == 200
    wait_for(lambda: len(pub.confirmed) >= blocked_at + 50, what="publishing resumed")
    # the client got both notifications, with RabbitMQ's reason
    assert pub.blocked.wait(10) and pub.unblocked.wait(10)
    assert pub.reasons == ["low on disk"]
    pub.stop.set()
    pub.join(30)
    assert pub.error is None, pub.error

    # every confirmed message is there
    while True:
        method, _props, body = ch.basic_get("alarm-q")
        if method is None:
            break
        ch.basic_ack(method.delivery_tag)
        got.append(int(body[: len(body) // 100]))
    cons.close()
    missing = set(pub.confirmed) - set(got)
    assert not missing, f"{len(missing)} confirmed messages lost: {sorted(missing)[:10]}"
