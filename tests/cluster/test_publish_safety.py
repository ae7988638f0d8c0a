"""Issue 10: confirmed publishes survive membership changes and leader churn.

Three real `Node`s in this process (real sockets, storage and Raft), as in
test_membership.py, so the test can drive membership directly between
publishes. A publisher keeps one confirming channel open through member
additions, removals and leader transfers that replace the queue process on
its node; every message it got a confirm for must then be consumed.
"""
from __future__ import annotations

import asyncio

import aio_pika
import pytest

from broker.runtime.node import Node
from broker.runtime.queues import QuorumQueue, RemoteQueue
from tests.cluster.test_membership import _until
from tests.cluster.test_membership import nodes as nodes  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


async def _publish(ch: aio_pika.abc.AbstractChannel, queue: str, bodies: list[bytes]) -> list[bytes]:
    """Publish with confirms; return the bodies confirmed (acked)."""
    confirmed = []
    for b in bodies:
        await ch.default_exchange.publish(aio_pika.Message(b, delivery_mode=2), routing_key=queue)
        confirmed.append(b)  # aio-pika raises on a nack; an ack returns
    return confirmed


async def _drain(port: int, queue: str, expect: int) -> list[bytes]:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=100)
    q = await ch.get_queue(queue, ensure=False)
    got: list[bytes] = []
    async with q.iterator() as it:
        async def read() -> None:
            async for msg in it:
                got.append(msg.body)
                await msg.ack()
                if len(got) >= expect:
                    return
        try:
            await asyncio.wait_for(read(), 20)
        except TimeoutError:
            pass
    await conn.close()
    return got


async def test_confirms_survive_the_publishers_node_gaining_and_losing_a_member(
        nodes: list[Node]) -> None:  # noqa: F811
    """Defect 1: a membership change on the publisher's node replaced the queue
    process and restarted the channel's numbering at 1: the machine answered
    DUPLICATE and the channel confirmed messages that were never enqueued."""
    n0, n1, n2 = nodes
    admin = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{n0.port}/")
    ach = await admin.channel()
    await ach.declare_queue("pub-safety", durable=True, arguments={
        "x-queue-type": "quorum", "x-quorum-initial-group-size": 1})
    await admin.close()
    # The publisher sits on n1, which holds no member yet (RemoteQueue).
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{n1.port}/")
    ch = await conn.channel(publisher_confirms=True)
    assert isinstance(n1.queues[("/", "pub-safety")], RemoteQueue)
    confirmed = await _publish(ch, "pub-safety", [b"a-%d" % i for i in range(30)])

    await n0.membership.add_member("/", "pub-safety", n1.node_name)
    await _until(lambda: isinstance(n1.queues[("/", "pub-safety")], QuorumQueue))
    confirmed += await _publish(ch, "pub-safety", [b"b-%d" % i for i in range(30)])

    await n0.membership.transfer_leader("/", "pub-safety", n1.node_name)
    confirmed += await _publish(ch, "pub-safety", [b"c-%d" % i for i in range(30)])

    await n0.membership.add_member("/", "pub-safety", n2.node_name)
    await n0.membership.delete_member("/", "pub-safety", n1.node_name)
    await _until(lambda: isinstance(n1.queues[("/", "pub-safety")], RemoteQueue))
    confirmed += await _publish(ch, "pub-safety", [b"d-%d" % i for i in range(30)])
    await conn.close()

    got = await _drain(n2.port, "pub-safety", len(confirmed))
    lost = sorted(set(confirmed) - set(got))
    assert lost == [], f"confirmed but never delivered: {lost}"
    assert sorted(got) == sorted(confirmed)


async def test_a_consume_waiting_for_a_leader_is_dropped_when_its_channel_closes(
        nodes: list[Node]) -> None:  # noqa: F811
    """Chaos run n3-s1005 (issue 10): while a queue had no quorum, consumers
    kept reconnecting; their basic.consume commands waited on the node and
    were all applied once the quorum was back, each after its channel had
    closed: every message was delivered into the void and returned twenty
    times, then dropped by the delivery limit. A consume still waiting when
    its channel closes must never be applied."""
    n0, n1, n2 = nodes
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{n1.port}/")
    ch = await conn.channel(publisher_confirms=True)
    await ch.declare_queue("zombie", durable=True, arguments={
        "x-queue-type": "quorum", "x-quorum-initial-group-size": 2})
    members = n1.meta.state.queues[("/", "zombie")].members
    assert len(members) == 2
    await ch.default_exchange.publish(aio_pika.Message(b"m"), routing_key="zombie")
    await conn.close()
    outsider = next(n for n in nodes if n.node_name not in members)
    down = next(n for n in nodes if n.node_name in members and n is not n1)
    config = down.config
    await down.stop()  # the group {n1, n2} has no quorum now
    # Consumers on a node with no member come and go while nothing can commit.
    for _ in range(25):
        c = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{outsider.port}/")
        cch = await c.channel()
        await cch.set_qos(prefetch_count=5)
        q = await cch.get_queue("zombie", ensure=False)
        task = asyncio.ensure_future(q.consume(lambda m: None, consumer_tag="z"))
        await asyncio.sleep(0.05)
        task.cancel()
        await c.close()
    restarted = Node(config)
    await restarted.start()
    nodes[nodes.index(down)] = restarted  # the fixture stops it
    # Once the group has a quorum again, the message is delivered exactly as
    # a fresh one: no failed deliveries were counted against it.
    c = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{outsider.port}/")
    cch = await c.channel()
    q = await cch.get_queue("zombie", ensure=False)
    msg = None
    for _ in range(200):
        msg = await q.get(no_ack=False, fail=False, timeout=10)
        if msg is not None:
            break
        await asyncio.sleep(0.1)
    if msg is None:
        leader = n1.queues[("/", "zombie")]
        raise AssertionError(f"no message: {leader.overview()} consumers={list(leader.state.consumers)} "
                             f"leader={leader.is_leader} group={leader.group.leader}")
    assert msg.body == b"m"
    assert not (msg.headers or {}).get("x-delivery-count"), msg.headers
    await msg.ack()
    await c.close()
