"""Vhost and user limits across a real 3-node cluster (issue 15): set through
one node's management API, replicated by the metadata Raft group to every
node, and counted cluster-wide as RabbitMQ 3.10 counts them: connections
of a vhost or user and channels of a user on *other* nodes count (seen
after at most about a second, runtime/limits.py), queues of a vhost are
counted by the metadata machine itself (exact)."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.mgmt.conftest import MgmtCluster, wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtCluster]:
    c = MgmtCluster(tmp_path_factory.mktemp("limits"), extra="loopback_users = none\n")
    c.start()
    api = c.apis[0]
    assert api.put("/api/vhosts/cl-v")[0] in (201, 204)
    assert api.put("/api/users/cl-user", {"password": "pw", "tags": ""})[0] in (201, 204)
    for user in ("guest", "cl-user"):
        assert api.put(f"/api/permissions/cl-v/{user}",
                       {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    yield c
    c.kill_all()


def connect(c: MgmtCluster, i: int, vhost: str = "cl-v", user: str = "guest",
            password: str = "guest") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", c.nodes[i].port, vhost, pika.PlainCredentials(user, password)))


def eventually_refused(attempt: Callable[[], Any], timeout: float = 10.0) -> BaseException:
    """Repeat `attempt` (which closes what it opened when it succeeds) until it
    raises: other nodes' counts reach a node within about a second."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            attempt()
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.ConnectionClosedByBroker) as exc:
            return exc
        assert time.monotonic() < deadline, "never refused"
        time.sleep(0.2)


def test_limits_are_replicated_to_every_node(cluster: MgmtCluster) -> None:
    a, b, c = cluster.apis
    assert a.put("/api/vhost-limits/cl-v/max-queues", {"value": 50})[0] == 204
    assert a.put("/api/user-limits/cl-user/max-channels", {"value": 40})[0] == 204
    for api in (b, c):
        wait_for(lambda api=api: api.get("/api/vhost-limits/cl-v")[1]
                 == [{"vhost": "cl-v", "value": {"max-queues": 50}}], what="vhost limit replicated")
        wait_for(lambda api=api: api.get("/api/user-limits/cl-user")[1]
                 == [{"user": "cl-user", "value": {"max-channels": 40}}], what="user limit replicated")
    assert c.delete("/api/vhost-limits/cl-v/max-queues")[0] == 204  # any node may change them
    assert c.delete("/api/user-limits/cl-user/max-channels")[0] == 204
    wait_for(lambda: a.get("/api/vhost-limits")[1] == [] and a.get("/api/user-limits")[1] == [],
             what="limits cleared everywhere")


def test_vhost_connection_limit_counts_other_nodes(cluster: MgmtCluster) -> None:
    api = cluster.apis[0]
    assert api.put("/api/vhost-limits/cl-v/max-connections", {"value": 1})[0] == 204
    wait_for(lambda: cluster.apis[1].get("/api/vhost-limits/cl-v")[1], what="replicated")
    first = connect(cluster, 0)
    err = eventually_refused(lambda: connect(cluster, 1).close())
    assert "NOT_ALLOWED - access to vhost 'cl-v' refused for user 'guest': connection limit (1) " \
           "is reached" in str(err)
    other = connect(cluster, 1, vhost="/")  # another vhost on that node is not limited
    first.close()  # its place is free again, on every node (after a refresh)
    wait_for(lambda: _connects(cluster, 2), what="a connection allowed once the first closed")
    assert api.delete("/api/vhost-limits/cl-v/max-connections")[0] == 204
    other.close()


def _connects(cluster: MgmtCluster, i: int) -> bool:
    try:
        connect(cluster, i).close()
        return True
    except pika.exceptions.AMQPConnectionError:
        return False


def test_user_channel_limit_counts_other_nodes(cluster: MgmtCluster) -> None:
    api = cluster.apis[0]
    assert api.put("/api/user-limits/cl-user/max-channels", {"value": 1})[0] == 204
    wait_for(lambda: cluster.apis[2].get("/api/user-limits/cl-user")[1], what="replicated")
    holder = connect(cluster, 0, user="cl-user", password="pw")
    ch = holder.channel()

    def open_channel_on_node_2() -> None:
        conn = connect(cluster, 2, user="cl-user", password="pw")
        try:
            conn.channel()
        finally:
            if conn.is_open:
                conn.close()

    err = eventually_refused(open_channel_on_node_2)
    assert isinstance(err, pika.exceptions.ConnectionClosedByBroker)
    assert (err.reply_code, err.reply_text) == (
        530, "NOT_ALLOWED - number of channels opened for user 'cl-user' has reached the maximum "
             "allowed user limit of (1)")
    # the holder's channel works: it publishes with confirms
    ch.queue_declare("cl-ch-q", durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    ch.basic_publish("", "cl-ch-q", b"x", mandatory=True)
    ch.queue_delete("cl-ch-q")
    assert api.delete("/api/user-limits/cl-user/max-channels")[0] == 204
    wait_for(lambda: not cluster.apis[2].get("/api/user-limits/cl-user")[1], what="cleared")
    open_channel_on_node_2()
    holder.close()


def test_vhost_queue_limit_is_exact_across_nodes(cluster: MgmtCluster) -> None:
    api = cluster.apis[0]
    assert api.put("/api/vhost-limits/cl-v/max-queues", {"value": 1})[0] == 204
    wait_for(lambda: cluster.apis[2].get("/api/vhost-limits/cl-v")[1], what="replicated")
    c0 = connect(cluster, 0)
    c0.channel().queue_declare("cl-q1", durable=True, arguments={"x-queue-type": "quorum"})
    c2 = connect(cluster, 2)
    ch = c2.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare("cl-q2", durable=True, arguments={"x-queue-type": "quorum"})
    assert (err.value.reply_code, err.value.reply_text) == (
        406, "PRECONDITION_FAILED - cannot declare queue 'cl-q2': queue limit in vhost 'cl-v' (1) "
             "is reached")
    c0.channel().queue_delete("cl-q1")
    c2.channel().queue_declare("cl-q2", durable=True, arguments={"x-queue-type": "quorum"})
    assert api.delete("/api/vhost-limits/cl-v/max-queues")[0] == 204
    c2.channel().queue_delete("cl-q2")
    c0.close()
    c2.close()
