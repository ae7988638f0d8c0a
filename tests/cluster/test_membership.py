"""Membership operations on a real 3-node cluster running in this process
(three `Node`s in one event loop: real sockets, real storage, real Raft), so
the test can call `node.membership` directly. Clients are aio-pika.

Covers add member (learner then promoted), grow onto a node, quorum status,
leader transfer and rebalance, the quorum-critical check, delete member with
its quorum refusal (and force), shrink, drain; and that no message is lost."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import pytest

from broker import metadata as md
from broker.common.config import load_config
from broker.runtime.membership import MembershipError
from broker.runtime.node import Node
from broker.runtime.queues import QuorumQueue
from tests.e2e.broker_proc import free_port

pytestmark = pytest.mark.slow


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[list[Node]]:
    secret = tmp_path / "secret"
    secret.write_text("membership-test-secret-012345\n")
    cports = [free_port() for _ in range(3)]
    names = [f"m-{i}@127.0.0.1" for i in range(3)]
    seeds = ",".join(f"{n}:{p}" for n, p in zip(names, cports, strict=True))
    ns = []
    for i in range(3):
        cfg = load_config("", {
            "QQ__NODE__NAME": names[i], "QQ__NODE__DATA_DIR": str(tmp_path / f"n{i}"),
            "QQ__LISTENERS__TCP__DEFAULT": str(free_port()), "QQ__LISTENERS__TCP__BIND": "127.0.0.1",
            "QQ__CLUSTER__PORT": str(cports[i]), "QQ__CLUSTER__BIND": "127.0.0.1",
            "QQ__CLUSTER__SECRET_FILE": str(secret), "QQ__CLUSTER__SEEDS": seeds,
            "QQ__MANAGEMENT__TCP__PORT": "0", "QQ__PROMETHEUS__TCP__PORT": "0",
        })
        ns.append(Node(cfg))
    await asyncio.gather(*(n.start() for n in ns))
    yield ns
    for n in ns:
        await n.stop()


async def _until(cond, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    async def loop() -> None:
        while not cond():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(loop(), timeout)


async def get_acked(ch: aio_pika.abc.AbstractChannel, queue: str, n: int) -> list[bytes]:
    """Get and ack `n` messages of `queue` (each must come within 10 s)."""
    q = await ch.declare_queue(queue, passive=True)
    got: list[bytes] = []
    while len(got) < n:
        msg = await q.get(timeout=10, fail=False)
        assert msg is not None, f"{queue}: only {len(got)} messages"
        got.append(msg.body)
        await msg.ack()
    return got


async def test_membership_operations(nodes: list[Node]) -> None:
    n0, n1, n2 = nodes
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{n0.port}/")
    ch = await conn.channel(publisher_confirms=True)
    for q in ("m1", "m2", "m3"):
        await ch.declare_queue(q, durable=True, arguments={"x-queue-type": "quorum",
                                                          "x-quorum-initial-group-size": 1})
        for i in range(20):
            await ch.default_exchange.publish(aio_pika.Message(f"{q}-{i}".encode()), routing_key=q)
    m = n0.membership

    # add a member: it joins as a learner and is promoted once caught up
    await m.add_member("/", "m1", n1.node_name)
    status = await m.quorum_status("/", "m1")
    assert {s["node"] for s in status if s["voter"]} == {n0.node_name, n1.node_name}
    await _until(lambda: ("/", "m1") in n1.queues and n1.queues[("/", "m1")].overview()["messages_ready"] == 20)
    with pytest.raises(MembershipError) as err:
        await m.add_member("/", "m1", n1.node_name)
    assert err.value.status == 400 and "already a member" in err.value.reason
    with pytest.raises(MembershipError) as err:
        await m.add_member("/", "nope", n1.node_name)
    assert err.value.status == 404

    # grow every queue onto n2 (strategy all), with progress reports
    seen = []
    results = await m.grow(n2.node_name, "all", progress=seen.append)
    assert [r["result"] for r in results] == ["ok"] * 3 and len(seen) == 3
    assert all(n2.node_name in r.members for r in n0.meta.state.queues.values())

    # rebalance: all three queues are led by n0; afterwards each node leads one
    results = await m.rebalance()
    await _until(lambda: len({n0.queue_leader("/", q) for q in ("m1", "m2", "m3")}) == 3)

    # quorum-critical: m2 and m3 have two members (n0, n2): without n0 they lose quorum
    assert m.quorum_critical(n0.node_name) == [("/", "m2"), ("/", "m3")]

    # delete a member: refused when the rest would have no online quorum, unless forced
    cfg2 = n2.config
    await n2.stop()
    await _until(lambda: not n0.cluster.transport.is_connected(n2.node_name))
    with pytest.raises(MembershipError) as err:
        await m.delete_member("/", "m1", n1.node_name)
    assert err.value.status == 409 and "online quorum" in err.value.reason
    await m.delete_member("/", "m1", n1.node_name, force=True)
    assert n0.registry.queue_record("/", "m1").members == (n0.node_name, n2.node_name)

    # n2 restarts with its data and rejoins as itself
    n2 = Node(cfg2)
    nodes[2] = n2
    await n2.start()

    # shrink n2 off every queue, then drain n0: its members move to n1 and n2
    results = await m.shrink(n2.node_name)
    assert all(r["result"] == "ok" for r in results), results
    assert not any(n2.node_name in r.members for r in n0.meta.state.queues.values())
    results = await m.drain(n0.node_name)
    assert all(r["result"] == "ok" for r in results), results
    for r in n1.meta.state.queues.values():
        assert len(r.members) == 1 and n0.node_name not in r.members, r
        await _until(lambda r=r: n1.queue_leader(r.vhost, r.name) in r.members)

    # every confirmed message is still there (read through n1)
    conn2 = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{n1.port}/")
    ch2 = await conn2.channel()
    for q in ("m1", "m2", "m3"):
        assert await get_acked(ch2, q, 20) == [f"{q}-{i}".encode() for i in range(20)]
    await conn2.close()
    await conn.close()


async def test_changes_made_from_a_stale_metadata_copy_follow_the_raft_configuration(
        nodes: list[Node], monkeypatch: pytest.MonkeyPatch) -> None:
    """The seed-7102 loss: member lists were read-modify-writes of the local
    (possibly stale) metadata record, and a node the list no longer named
    deleted its replica though it was a Raft voter, so the queue lost its
    quorum for good. Now the list written is the leader's committed Raft
    configuration, ordered by its index, and a voter keeps its replica."""
    by_name = {n.node_name: n for n in nodes}
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{nodes[0].port}/")
    ch = await conn.channel(publisher_confirms=True)
    await ch.declare_queue("stale", durable=True, arguments={"x-queue-type": "quorum",
                                                            "x-quorum-initial-group-size": 1})
    for i in range(30):
        await ch.default_exchange.publish(aio_pika.Message(f"s-{i}".encode()), routing_key="stale")
    (a,) = nodes[0].registry.queue_record("/", "stale").members
    b, c = sorted(n for n in by_name if n != a)
    m = nodes[0].membership
    await m.add_member("/", "stale", b)
    stale = nodes[0].registry.queue_record("/", "stale")
    assert set(stale.members) == {a, b}
    await m.add_member("/", "stale", c)

    # b's copy of the metadata still says {a, b} (as on a node that was cut
    # off while the second change ran); b removes itself.
    nb = by_name[b]
    monkeypatch.setattr(nb.membership, "_record", lambda vhost, queue: stale)
    await nb.membership.delete_member("/", "stale", b)
    monkeypatch.undo()
    assert (await m.raft_config("/", "stale")).members == {a, c}
    for n in nodes:
        await _until(lambda n=n: set(n.registry.queue_record("/", "stale").members) == {a, c})
    assert isinstance(by_name[c].queues[("/", "stale")], QuorumQueue)
    await _until(lambda: not isinstance(nb.queues[("/", "stale")], QuorumQueue))

    # An unindexed list leaving c out (what the old code could write): c is a
    # voter of a configuration at least as new, so it keeps its replica (the
    # same process throughout) and writes the leader's configuration back.
    replica = by_name[c].queues[("/", "stale")]
    await nodes[0].meta_execute(md.SetQueueMembers(md.VhostName("/"), md.QueueName("stale"),
                                                   (md.NodeName(a),)))
    for n in nodes:
        await _until(lambda n=n: set(n.registry.queue_record("/", "stale").members) == {a, c})
    assert by_name[c].queues[("/", "stale")] is replica and not replica.deleted

    # Acks commit only with c's replica ({a, c} is the quorum): all 30 come back.
    ch2 = await conn.channel()
    assert await get_acked(ch2, "stale", 30) == [f"s-{i}".encode() for i in range(30)]
    await ch2.close()
    ch3 = await conn.channel()
    assert (await ch3.declare_queue("stale", passive=True)).declaration_result.message_count == 0
    await conn.close()
