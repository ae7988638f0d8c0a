"""Resource alarms (issue 15): a node whose disk runs low blocks publishers on
every node with connection.blocked while consumers keep draining; nothing
confirmed is lost; publishing resumes when space returns.

Needs root (it mounts a small tmpfs under one node's data directory); CI runs
as root.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.mgmt.conftest import MgmtCluster, wait_for
from tests.storage.helpers import fill_disk, tmpfs

pytestmark = [pytest.mark.root, pytest.mark.slow]

LIMIT = 4 << 20  # disk_free_limit.absolute
QQ = {"x-queue-type": "quorum"}


class Publisher(threading.Thread):
    """Confirmed publishes of 1, 2, 3... on one connection until stopped;
    notes connection.blocked / unblocked as the client library reports them."""

    def __init__(self, port: int, queue: str = "alarm-q") -> None:
        super().__init__(daemon=True)
        self.port = port
        self.queue = queue
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
                ch.basic_publish("", self.queue, str(n).encode() * 100,  # mandatory: an
                                 pika.BasicProperties(delivery_mode=2),  # unroutable one raises
                                 mandatory=True)
                self.confirmed.append(n)  # returns once confirmed (raises on a nack)
                conn.process_data_events(0)  # hands over queued blocked/unblocked callbacks
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _on_blocked(self, _conn: object, method: object) -> None:
        self.reasons.append(method.method.reason)  # type: ignore[attr-defined]
        self.blocked.set()


@contextlib.contextmanager
def _node3_on_small_disk(tmp_path: Path, extra: str) -> Iterator[tuple[MgmtCluster, Path]]:
    """A 3-node cluster whose node 3 keeps its data on a 24 MiB tmpfs (its log
    elsewhere); yields the cluster and the mount point."""
    with tmpfs(tmp_path / "n3mnt", "24m", "qqalarm") as mnt:
        c = MgmtCluster(tmp_path / "c", extra=extra)
        c.nodes[2].data_dir = mnt / "data"
        c.nodes[2].log_path = tmp_path / "n3.log"  # not on the small disk
        try:
            c.start()
            yield c, mnt
        finally:
            c.kill_all()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[MgmtCluster, Path]]:
    with _node3_on_small_disk(tmp_path, f"disk_free_limit.absolute = {LIMIT}\n"
                              "alarms.check_interval_ms = 100\nraft.wal_max_size_bytes = 1048576\n") as c:
        yield c


def _caught_up(c: MgmtCluster, queue: str, node: str) -> bool:
    """The queue has a leader and `node`'s member is online with everything
    the leader committed."""
    status = c.apis[0].get(f"/api/queues/%2F/{queue}/quorum-status")[1]
    leader = next((m for m in status if m["raft_state"] == "leader"), None)
    mine = next((m for m in status if m["node"] == node), None)
    return leader is not None and mine is not None and mine["online"] \
        and mine["match_index"] == leader["commit_index"]


def _bodies(ch: Any, queue: str) -> list[bytes]:
    """basic.get (and ack) until empty."""
    out: list[bytes] = []
    while True:
        method, _props, body = ch.basic_get(queue)
        if method is None:
            return out
        ch.basic_ack(method.delivery_tag)
        out.append(body)


def _drain(ch: Any, queue: str) -> list[int]:
    """basic.get (and ack) until empty: the numbers Publisher sent."""
    return [int(body[: len(body) // 100]) for body in _bodies(ch, queue)]


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
    got += _drain(ch, "alarm-q")
    cons.close()
    missing = set(pub.confirmed) - set(got)
    assert not missing, f"{len(missing)} confirmed messages lost: {sorted(missing)[:10]}"


@pytest.fixture
def unguarded(tmp_path: Path) -> Iterator[tuple[MgmtCluster, Path]]:
    """Node 3 on the small disk with the disk alarm off: its writes hit ENOSPC."""
    with _node3_on_small_disk(tmp_path, "disk_free_limit.absolute = 0\nraft.wal_max_size_bytes = 1048576\n"
                              "cluster.housekeeping_interval_ms = 500\n") as c:
        yield c


def test_a_member_stopped_by_a_full_disk_starts_again_once_there_is_room(
        unguarded: tuple[MgmtCluster, Path]) -> None:
    """With no disk alarm to block publishers, node 3's disk fills up: its
    member of the queue stops on ENOSPC (health check raft-groups 503) while
    the other two keep confirming. Once the filler is gone the member starts
    again by itself (no node restart), catches up with the leader, and every
    confirmed message is there."""
    c, mnt = unguarded
    n1, n2, n3 = c.nodes
    setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", n1.port))
    setup.channel().queue_declare("full-q", durable=True,
                                  arguments={**QQ, "x-quorum-initial-group-size": 3})
    setup.close()
    status = c.apis[0].get("/api/queues/%2F/full-q/quorum-status")[1]
    assert n3.name in [m["node"] for m in status], status
    pub = Publisher(n1.port, "full-q")
    pub.start()
    wait_for(lambda: len(pub.confirmed) >= 50, what="publishing under way")
    filler = mnt / "filler"
    fill_disk(filler)
    wait_for(lambda: c.apis[2].get("/api/health/checks/raft-groups")[0] == 503, timeout=60,
             what="node 3's member stopped on the full disk")
    _status, body = c.apis[2].get("/api/health/checks/raft-groups")
    assert any("full-q" in g["group"] or "No space" in g["reason"] for g in body["groups"]), body
    stopped_at = len(pub.confirmed)
    wait_for(lambda: len(pub.confirmed) >= stopped_at + 50, what="confirms go on with two members")
    filler.unlink()
    wait_for(lambda: c.apis[2].get("/api/health/checks/raft-groups")[0] == 200, timeout=60,
             what="the member started again")
    pub.stop.set()
    pub.join(30)
    assert pub.error is None, pub.error

    wait_for(lambda: _caught_up(c, "full-q", n3.name), timeout=60,
             what="node 3's member caught up with the leader")
    cons = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", n2.port))
    got = _drain(cons.channel(), "full-q")
    cons.close()
    missing = set(pub.confirmed) - set(got)
    assert not missing, f"{len(missing)} confirmed messages lost: {sorted(missing)[:10]}"


def test_the_metadata_store_stopped_by_a_full_disk_starts_again_and_catches_up(
        unguarded: tuple[MgmtCluster, Path]) -> None:
    """Node 3's disk fills up with the alarm off: the next metadata write
    stops its metadata group on ENOSPC (health check raft-groups 503 names
    it). A queue declared on node 1 meanwhile has no member running on node 3.
    Once the filler is gone, the metadata group starts again in place (no
    node restart), replays its log and catches up: node 3 starts the member
    of the queue declared while it was stopped, serves declarations again,
    and every message confirmed to that queue is there."""
    c, mnt = unguarded
    n1, n2, n3 = c.nodes
    setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", n1.port))
    ch = setup.channel()
    ch.queue_declare("before-q", durable=True, arguments={**QQ, "x-quorum-initial-group-size": 3})
    filler = mnt / "filler"
    fill_disk(filler)

    def stopped_groups() -> list[str]:
        status, body = c.apis[2].get("/api/health/checks/raft-groups")
        return [g["group"] for g in body.get("groups", [])] if status == 503 else []
    # metadata writes (exchange declarations with a large argument) until
    # node 3's fails: the first few may still fit in its WAL's last page
    for i in range(200):
        try:
            ch.exchange_declare(f"filler-{i}", arguments={"blob": "x" * 8000})
        except pika.exceptions.ConnectionClosedByBroker as exc:
            # node 3 led the metadata group: the command it was proposing
            # when it stopped fails (541, outcome unknown); the others elect
            # a new leader
            assert exc.reply_code == 541 and "__metadata__ stopped" in exc.reply_text, exc
            setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", n1.port))
            ch = setup.channel()
        if "__metadata__" in stopped_groups():
            break
    assert "__metadata__" in stopped_groups(), "node 3's metadata group never stopped"
    ch.queue_declare("while-q", durable=True, arguments={**QQ, "x-quorum-initial-group-size": 3})
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", "while-q", str(i).encode(), pika.BasicProperties(delivery_mode=2),
                         mandatory=True)
    filler.unlink()
    wait_for(lambda: c.apis[2].get("/api/health/checks/raft-groups")[0] == 200, timeout=90,
             what="node 3's groups started again")

    wait_for(lambda: _caught_up(c, "while-q", n3.name), timeout=60,
             what="node 3 runs the member of the queue declared while its metadata was stopped")
    assert _caught_up(c, "before-q", n3.name)
    # node 3 serves metadata commands again, and its replica has them all
    on3 = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", n3.port))
    ch3 = on3.channel()
    ch3.queue_declare("after-q", durable=True, arguments=QQ)
    assert ch3.queue_declare("while-q", passive=True).method.message_count == 50
    on3.close()
    wait_for(lambda: {"before-q", "while-q", "after-q"} <= {
        q["name"] for q in c.apis[2].get("/api/queues")[1]}, what="node 3 lists every queue")
    got = sorted(int(b) for b in _bodies(setup.channel(), "while-q"))
    setup.close()
    assert got == list(range(50))
