"""At-least-once dead lettering on a real 3-node cluster (in-process nodes, as
test_membership.py): the leader's internal dead-letter consumer publishes to
the target with confirms and settles in the source only after the target
confirmed; a missing target keeps the dead letters in the source (counted
as messages_dlx) until it exists; leadership moving mid-way loses nothing.
"""
from __future__ import annotations

import aio_pika
import pytest

from broker.runtime.node import Node
from tests.cluster.test_membership import _until
from tests.cluster.test_membership import nodes as nodes  # noqa: F401 - fixture

pytestmark = pytest.mark.slow

ARGS = {"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "alo-dlq",
        "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
        "x-message-ttl": 100}


async def test_dead_letters_wait_for_a_missing_target_and_survive_a_leader_change(
        nodes: list[Node]) -> None:  # noqa: F811
    n0, n1, n2 = nodes
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{n0.port}/")
    ch = await conn.channel(publisher_confirms=True)
    await ch.declare_queue("alo-src", durable=True, arguments=ARGS)
    bodies = [b"dl-%d" % i for i in range(40)]
    for b in bodies:
        await ch.default_exchange.publish(aio_pika.Message(b), routing_key="alo-src")

    def dlx_count(node: Node) -> int:
        q = node.queues[("/", "alo-src")]
        return q.overview()["messages_dlx"]
    # expired, but the target does not exist yet: kept in the source
    await _until(lambda: dlx_count(n0) == 40)
    assert n0.queues[("/", "alo-src")].overview()["messages_ready"] == 0

    # the worker moves with leadership
    await n0.membership.transfer_leader("/", "alo-src", n1.node_name)
    await _until(lambda: n1.queues[("/", "alo-src")].is_leader)

    await ch.declare_queue("alo-dlq", durable=True, arguments={"x-queue-type": "quorum"})
    await _until(lambda: all(dlx_count(n) == 0 for n in (n0, n1, n2)), timeout=60)

    got: list[bytes] = []
    dlq = await ch.get_queue("alo-dlq", ensure=False)
    while True:
        msg = await dlq.get(no_ack=False, fail=False, timeout=5)
        if msg is None:
            break
        got.append(msg.body)
        death = msg.headers.get("x-death")
        assert death and death[0]["reason"] == "expired" and death[0]["queue"] == "alo-src"
        await msg.ack()
    await conn.close()
    assert set(got) == set(bodies)  # none lost (a duplicate is allowed)
    assert len(got) - len(set(got)) <= 40
    print(f"\ndead letters delivered: {len(got)} ({len(got) - len(set(got))} duplicates)")


async def test_a_new_worker_on_the_same_node_delivers_its_dead_letters(
        nodes: list[Node]) -> None:  # noqa: F811
    """Safety review of issue 10: a second dead-letter worker on the same node
    (leadership gone and back) reused the first one's publisher identity; the
    target answered its first dead letters DUPLICATE and they were settled in
    the source without ever being delivered."""
    n0, n1, n2 = nodes
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{n0.port}/")
    ch = await conn.channel(publisher_confirms=True)
    await ch.declare_queue("alo-dlq", durable=True, arguments={"x-queue-type": "quorum"})
    await ch.declare_queue("alo-src", durable=True, arguments=ARGS)

    def count(node: Node, name: str) -> int:
        return node.queues[("/", name)].overview()["messages"]

    async def publish_and_wait(prefix: str, total: int) -> None:
        for i in range(10):
            await ch.default_exchange.publish(aio_pika.Message(b"%s-%d" % (prefix.encode(), i)),
                                              routing_key="alo-src")
        await _until(lambda: count(n0, "alo-src") == 0 and count(n0, "alo-dlq") == total
                     if n0.queues[("/", "alo-dlq")].is_leader else
                     n0.queues[("/", "alo-src")].overview()["messages_dlx"] == 0, timeout=60)
    await publish_and_wait("first", 10)
    await n0.membership.transfer_leader("/", "alo-src", n1.node_name)
    await n0.membership.transfer_leader("/", "alo-src", n0.node_name)  # a second worker on n0
    await publish_and_wait("second", 20)

    dlq = await ch.get_queue("alo-dlq", ensure=False)
    got: set[bytes] = set()
    while True:
        msg = await dlq.get(no_ack=True, fail=False, timeout=5)
        if msg is None:
            break
        got.add(msg.body)
    await conn.close()
    assert got == {b"%s-%d" % (p, i) for p in (b"first", b"second") for i in range(10)}
